// Runs queued jobs: one worker thread per device claims the next job from the store (highest
// priority, fair between tenants, oldest first) under a lease it keeps renewing, hands it to
// the JobRunner (the sandboxed worker process) with its model, data, scratch directory,
// timeout and cancellation, and ends it in the repository with the results the runner left in
// scratch adopted into the blob store. The queue is the store: in one process or in many on
// PostgreSQL the same way. A cancel reaches the worker at once in its own process, and
// through the lease renewal (within a second) from any other. A reaper puts back the jobs
// whose worker stopped renewing (it died, or lost the store) once their lease has ended.
//
// A sharded job is a parent and its shards, all in the store. Workers claim shards like any
// job (any worker, any process); coordinator threads (as many as workers, at least two)
// claim parents, under leases too: a coordinator sums its shards' progress, and once every
// shard has succeeded runs the merge (a sandboxed task: it loads the model) of their
// statistics into the job's results. A shard whose worker dies is run again alone; a shard
// that fails fails the job and cancels the others.
//
// Its parts: leases.h (claims, the heartbeat, the reaper), shard_coordinator.h,
// task_builder.h (the task of a run or a merge), run_progress.h, scratch.h (a run's files
// into the blob store), wake_signal.h (what idle threads wait on).
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/job_finished.h"
#include "server/jobs/job_repository.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/leases.h"
#include "server/jobs/model_registry.h"
#include "server/jobs/scheduler_options.h"
#include "server/jobs/scratch.h"
#include "server/jobs/shard_coordinator.h"
#include "server/jobs/stream_feed.h"
#include "server/jobs/task_builder.h"
#include "server/jobs/wake_signal.h"
#include "server/store/blob_store.h"

namespace recal::jobs {

class Scheduler {
 public:
  Scheduler(JobRepository* jobs, store::BlobStore* blobs, ModelRegistry* models, JobRunner* runner,
            StreamFeeds* feeds, SchedulerOptions options);
  ~Scheduler();

  // Recovers what a previous process left running, queues the waiting jobs, starts workers.
  absl::Status Start();
  // Stops taking jobs, stops the runners (their jobs go back to QUEUED for the next start)
  // and returns when the workers have stopped or `deadline` has passed.
  void Shutdown(absl::Duration deadline);

  // RESOURCE_EXHAUSTED when max_queued_jobs wait already.
  absl::Status CheckCapacity() const;
  // A job just created QUEUED: a worker of this process looks now.
  void Enqueue(const v1::Job& job);
  // A job just cancelled: its runner is stopped if it runs here.
  void Cancel(const std::string& id);
  // Something changed in the store (another process queued a job): idle workers look now.
  void Wake();
  // Stops the shards of a sharded job that have not ended (in the store; here at once).
  void CancelShards(const std::vector<v1::Job>& shards, const std::string& reason);

  int queued() const;  // in the store, from every process
  int running() const;  // here
  // The name this process's leases carry (SchedulerOptions::owner, or the one made for it).
  const std::string& owner() const { return options_.owner; }

 private:
  // `kind`: a device's worker runs jobs and shards; a coordinator (device "coordinator")
  // coordinates sharded jobs.
  void WorkerLoop(const std::string& device, store::ClaimKind kind);
  // A claimed job, from its start to its end in the store, under its lease's heartbeat.
  void RunJob(const v1::Job& job, const std::string& device, RunFlags& flags);
  absl::StatusOr<JobOutputs> Execute(const v1::Job& job, const std::string& device, RunFlags& flags);
  // A client-stream job's pushed batches into `hooks`, from the feed its pushes go to.
  absl::Status AttachStream(const v1::Job& job, RunFlags& flags, double timeout, RunHooks& hooks);
  // A claimed client-stream job's feed in a worker process (Pushes::kRelayed), after
  // recording where api replicas relay to.
  absl::StatusOr<std::shared_ptr<StreamFeed>> OpenRelayedFeed(const v1::Job& job, RunFlags& flags);
  // The run's end (`outputs`, or why there are none) into the store, each write between two
  // of `heartbeat`'s renewals: the job as stored then (QUEUED: handed back at shutdown, to
  // run again).
  absl::StatusOr<v1::Job> StoreEnd(const v1::Job& job, const absl::StatusOr<JobOutputs>& outputs,
                                   const RunFlags& flags, LeaseHeartbeat& heartbeat);
  // A run without outputs: failed, cancelled, or handed back at shutdown.
  absl::StatusOr<v1::Job> StoreEndWithout(const v1::Job& job, const absl::Status& why, const RunFlags& flags);
  absl::StatusOr<v1::Job> SucceedWhileLeased(const std::string& id, const JobOutputs& outputs, const RunFlags& flags,
                                             LeaseHeartbeat& heartbeat);

  JobRepository* jobs_;
  store::BlobStore* blobs_;
  JobRunner* runner_;
  StreamFeeds* feeds_;
  const SchedulerOptions options_;
  const TaskSources sources_;

  std::atomic<bool> stopping_{false};
  WakeSignal wake_;
  Leases leases_;
  ShardCoordinator coordinator_;

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<RunFlags>> running_;
  std::vector<std::thread> workers_;
  bool started_ = false;

  std::mutex workers_mu_;
  std::condition_variable workers_cv_;
  int active_workers_ = 0;
};

}  // namespace recal::jobs
