// Jobs as the API sees them: submission (validated, idempotent on request_id), cancellation,
// pushed batches, watches and results, over the three parts that do the work: the job
// repository (durable state machine), the event hub (watchers) and the scheduler (queue,
// workers, runner).
#pragma once

#include <functional>
#include <atomic>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/event_hub.h"
#include "server/jobs/job_repository.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/model_registry.h"
#include "server/jobs/push_stream.h"
#include "server/jobs/scheduler.h"
#include "server/jobs/stream_feed.h"
#include "server/jobs/watch_cursor.h"
#include "server/jobs/watch_reads.h"
#include "server/store/blob_store.h"
#include "server/store/metadata_store.h"

namespace recal::jobs {

struct JobManagerOptions {
  SchedulerOptions scheduler;
  int64_t max_batch_size = 4096;
  int max_shards = 64;
  int64_t max_batch_bytes = int64_t{256} << 20;  // one pushed batch, all its inputs (client_stream)
  TenantLimitsFn limits;                         // none: no quotas
  // Whether client_stream jobs are taken: in the process that runs them (role all), or
  // where `relay` carries their batches to the worker process that runs them (role api).
  bool client_streams = true;
  // Set (role api): pushes are relayed to the worker process holding the job's lease,
  // waiting up to `relay_wait` for a worker to claim a job still QUEUED.
  PushRelay* relay = nullptr;
  // How often every waiting watcher reads the store even if nothing was announced.
  absl::Duration watch_recheck = absl::Seconds(30);
  absl::Duration relay_wait = absl::Seconds(60);
};

// Whom a call acts for. A job of another tenant answers exactly as a job that does not
// exist, unless the caller may see every tenant (an admin).
struct Caller {
  std::string tenant;
  bool all_tenants = false;
  bool Sees(const std::string& owner) const { return all_tenants || owner == tenant; }
};

class JobManager {
 public:
  // Every job's model runs through `runner` (the server's: a sandboxed worker process).
  JobManager(store::MetadataStore* metadata, store::BlobStore* blobs, ModelRegistry* models,
             JobRunner* runner, JobManagerOptions options);
  ~JobManager();

  // Re-queues jobs a previous process left running, queues the waiting ones, starts workers.
  absl::Status Start();
  // Refuses new work, stops the runners (their jobs go back to QUEUED for the next start)
  // and ends watches. Returns when the workers have stopped or `deadline` has passed.
  void Shutdown(absl::Duration deadline);

  // The job belongs to the caller's tenant, within its quotas. spec.model_id may be any
  // model reference (ModelRegistry::Resolve); the job stores the full id it resolves to.
  absl::StatusOr<v1::Job> Submit(const Caller& caller, const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::Job> Get(const Caller& caller, const std::string& id);
  // One tenant's jobs (empty: every tenant's); who may list which is the API's to decide.
  absl::StatusOr<store::JobPage> List(const std::string& tenant, const std::vector<v1::JobState>& states,
                                      int page_size, const std::string& page_token);
  absl::StatusOr<v1::Job> Cancel(const Caller& caller, const std::string& id);
  // Deletes an ended job with its events and results (MetadataStore::DeleteJob; refused while
  // it is queued or running: cancel it first); their blobs go once nothing references them.
  // Returns the job as it was and the bytes of results it held.
  struct Deleted {
    v1::Job job;
    int64_t result_bytes = 0;
  };
  absl::StatusOr<Deleted> Delete(const Caller& caller, const std::string& id);

  // Queues one pushed batch for a client_stream job (blocks while its queue is full); for a
  // sharded job, for its shard `shard` (each shard has its own pusher and its own `last`).
  // FAILED_PRECONDITION if the job does not take a client stream or has ended.
  absl::Status PushBatch(const Caller& caller, const std::string& id, int shard,
                         google::protobuf::RepeatedPtrField<v1::Tensor>& inputs, bool last);

  // The stream of a client's PushBatches call, opened at its first message, which names the
  // job (and shard). Role all: every message goes through PushBatch. With a relay: the job's
  // (or shard's) run must be claimed by a worker process first, waited for up to relay_wait
  // (UNAVAILABLE after it: nothing was consumed, push again; CANCELLED once `stopped`), and
  // the stream goes to that process's internal endpoint as the store records it.
  absl::StatusOr<std::unique_ptr<PushStream>> OpenPush(const Caller& caller, const std::string& id, int shard,
                                                       const std::function<bool()>& stopped);
  // A worker process's side of a relayed stream: the feed of the job or shard `feed_id` it
  // runs, waiting up to `wait` for its claim to open it; FAILED_PRECONDITION if it does not
  // run here.
  absl::StatusOr<std::shared_ptr<StreamFeed>> RelayedFeed(const std::string& feed_id, absl::Duration wait);
  // The largest pushed batch (Options::max_batch_bytes): what a stream may join from parts.
  int64_t max_batch_bytes() const { return options_.max_batch_bytes; }

  // A watch of the job `id` if the caller may see it (NOT_FOUND otherwise): the snapshot,
  // then every event with seq > after_seq, up to the terminal state (watch_cursor.h). The
  // watcher waits between reads on events() (read version() before Next(), subscribe with
  // it when a step is empty) and stops with UNAVAILABLE once stopping().
  absl::StatusOr<std::unique_ptr<WatchCursor>> OpenWatch(const Caller& caller, const std::string& id,
                                                          int64_t after_seq);
  EventHub& events() { return events_; }
  bool stopping() const { return stopping_; }

  // The stored artifact of a SUCCEEDED job (FAILED_PRECONDITION otherwise), and its bytes.
  absl::StatusOr<store::ResultRef> Result(const Caller& caller, const std::string& id, v1::Artifact artifact);
  struct OpenedResult {
    store::ResultRef ref;
    std::unique_ptr<store::BlobReader> reader;
  };
  absl::StatusOr<OpenedResult> OpenResult(const Caller& caller, const std::string& id, v1::Artifact artifact);

  int queued() const { return scheduler_.queued(); }
  int running() const { return scheduler_.running(); }
  // The name this process's leases carry; its internal endpoint is recorded under it.
  const std::string& lease_owner() const { return scheduler_.owner(); }

 private:
  // The plan of `spec` (PlanJob), refused first where the spec passes this server's limits
  // (batch size, shards, timeout) or asks for what it does not offer (client streams).
  absl::StatusOr<worker::v1::JobPlan> PlanWithinLimits(const std::string& tenant, const v1::JobSpec& spec);
  // Sets the job's wait (job_wait.h) from the queue as the store holds it now.
  absl::Status FillWait(v1::Job& job);
  // The job if the caller may see it; NOT_FOUND (worded as for a missing job) otherwise.
  absl::StatusOr<v1::Job> Visible(const Caller& caller, const std::string& id);
  // The tenant's limits on active jobs and submissions per minute, for the store to check.
  store::JobQuota QuotaOf(const std::string& tenant) const;
  // The job a client pushes to (a message naming `id` and `shard`) if it is visible, takes a
  // client stream and has that shard, and the id of the feed (the job's or the shard's).
  struct PushTarget {
    v1::Job job;
    std::string feed_id;
  };
  absl::StatusOr<PushTarget> FindPushTarget(const Caller& caller, const std::string& id, int shard);
  // The internal endpoint of the worker process that runs `feed_id`, once one does.
  absl::StatusOr<std::string> RelayTarget(const std::string& id, const std::string& feed_id,
                                          const std::function<bool()>& stopped);

  store::MetadataStore* metadata_;
  store::BlobStore* blobs_;
  ModelRegistry* models_;
  const JobManagerOptions options_;
  // Each tenant's bound on running jobs: the scheduler's, or TenantLimits' (RunningBound).
  const store::MaxRunningJobs max_running_;
  EventHub events_;
  JobRepository repository_;
  WatchReads watch_reads_{&repository_, &events_};
  StreamFeeds feeds_;
  Scheduler scheduler_;
  std::atomic<bool> stopping_{false};
  std::mutex submit_mu_;
  // The watchers' safety net: every JobManagerOptions::watch_recheck each watched job is read
  // from the store once more (WatchReads shares it between its watchers), in case a change
  // was never announced.
  std::mutex recheck_mu_;
  std::condition_variable recheck_stop_;
  std::thread recheck_;
  // Other processes' changes (PostgreSQL's NOTIFY): watchers and idle workers look at once
  // instead of at their next poll. Last: it goes first, before what its callback touches.
  std::unique_ptr<store::ChangeWatch> change_watch_;
};

}  // namespace recal::jobs
