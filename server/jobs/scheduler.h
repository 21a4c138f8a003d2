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
#include "absl/time/time.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/data_source_spec.h"
#include "server/jobs/job_repository.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/model_registry.h"
#include "server/jobs/stream_feed.h"
#include "server/store/blob_store.h"

namespace recal::metrics {
struct Metrics;
}

namespace recal::jobs {

struct SchedulerOptions {
  std::vector<std::string> devices = {"cpu"};  // one worker each
  int max_queued_jobs = 64;
  DataRoots data_roots;
  double default_timeout_seconds = 6 * 3600;
  // A client_stream job fails when no batch is pushed for this long, so that a client that
  // went away does not hold a worker until the job's timeout.
  absl::Duration stream_idle = absl::Minutes(5);
  absl::Duration progress_interval = absl::Milliseconds(250);
  metrics::Metrics* metrics = nullptr;  // none: nothing is counted
  // Runs of a job the server died during; past it the job fails instead of running again.
  int max_attempts = 3;
  // Who holds the leases of this process's jobs (default: host, pid and a random part).
  std::string owner;
  absl::Duration lease = absl::Seconds(30);
  // How often idle workers look for jobs queued by other processes, and the reaper for
  // expired leases.
  absl::Duration poll_interval = absl::Seconds(1);
  // At start, every job left RUNNING goes back to the queue (true: this is the only process
  // on the store, e.g. SQLite) or only those whose lease has ended (false).
  bool recover_all_at_start = true;
  // Where a client_stream job's pushed batches come from. kThisProcess (role all): this
  // process's API, into a feed opened when the job is queued. kRelayed (cluster roles): an
  // api replica relays them to the worker process that claimed the job, into a feed opened
  // at the claim; `relay_endpoint` is the address this process takes them on, recorded in
  // the store under `owner` (empty: it takes none, and fails such jobs when it claims one).
  enum class Pushes { kThisProcess, kRelayed };
  Pushes pushes = Pushes::kThisProcess;
  std::string relay_endpoint;
  // Each tenant's bound on the workers its jobs hold at once, in every process on the store
  // (none: the workers are the only bound). JobManager sets it from TenantLimits.
  store::MaxRunningJobs max_running_jobs;
};

// Logs and counts (when `metrics`) a job that has just reached a terminal state.
void JobFinished(const v1::Job& job, metrics::Metrics* metrics);

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
  struct Running {
    std::atomic<bool> cancel{false};
    std::atomic<bool> by_user{false};
    std::atomic<bool> lease_lost{false};  // another worker may have the job now: write nothing
  };
  struct Outputs {
    std::map<v1::Artifact, store::ResultRef> results;
    v1::RunReport report;
  };

  // `kind`: a device's worker runs jobs and shards; a coordinator (device "coordinator")
  // coordinates sharded jobs.
  void WorkerLoop(const std::string& device, store::ClaimKind kind);
  void ReaperLoop();
  void RunJob(const v1::Job& job, const std::string& device, const std::shared_ptr<Running>& running);
  // Renews the job's lease until `done`; turns a cancel seen there, or a lost lease, into
  // `running`'s flags.
  void KeepLease(const std::string& id, Running& running, const std::atomic<bool>& done);
  // Waits up to `timeout` for an Enqueue / Shutdown after Wakes() returned `seen`.
  int64_t Wakes();
  void WaitForWork(int64_t seen, absl::Duration timeout);
  absl::StatusOr<Outputs> Execute(const v1::Job& job, const std::string& device, Running& running);
  // A sharded job's run: waits for its shards (their progress becomes the job's), then merges.
  absl::StatusOr<Outputs> Coordinate(const v1::Job& job, Running& running);
  // A claimed client-stream job's feed in a worker process (Pushes::kRelayed), after
  // recording where api replicas relay to.
  absl::StatusOr<std::shared_ptr<StreamFeed>> OpenRelayedFeed(const v1::Job& job, Running& running);
  // The runner's files in `scratch` (named by artifact) into the blob store.
  absl::StatusOr<std::map<v1::Artifact, store::ResultRef>> AdoptResults(
      const std::string& scratch, const std::vector<std::pair<v1::Artifact, std::string>>& files);

  JobRepository* jobs_;
  store::BlobStore* blobs_;
  ModelRegistry* models_;
  JobRunner* runner_;
  StreamFeeds* feeds_;
  const SchedulerOptions options_;

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Running>> running_;
  std::vector<std::thread> workers_;
  std::thread reaper_;
  bool started_ = false;
  std::atomic<bool> stopping_{false};

  std::mutex workers_mu_;
  std::condition_variable workers_cv_;
  int active_workers_ = 0;

  std::mutex wake_mu_;
  std::condition_variable wake_;
  int64_t wakes_ = 0;
};

}  // namespace recal::jobs
