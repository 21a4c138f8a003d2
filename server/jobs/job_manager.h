// Jobs: submission (validated, idempotent on request_id), a bounded priority queue, one
// worker per device running the engine, cancellation at batch boundaries, per-job
// timeouts, an event log that watchers follow (also across restarts), and recovery of
// interrupted jobs at start-up. Every state change is durable before it is announced.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/event_hub.h"
#include "server/jobs/job_queue.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/model_registry.h"
#include "server/jobs/stream_feed.h"
#include "server/store/blob_store.h"
#include "server/store/metadata_store.h"

namespace recal::metrics {
struct Metrics;
}

namespace recal::jobs {

struct JobManagerOptions {
  std::vector<std::string> devices = {"cpu"};  // one worker each
  int max_queued_jobs = 64;
  std::vector<std::string> data_roots;
  double default_timeout_seconds = 6 * 3600;
  int64_t max_batch_size = 4096;
  int64_t max_batch_bytes = int64_t{256} << 20;  // one pushed tensor, client_stream
  absl::Duration progress_interval = absl::Milliseconds(250);
  metrics::Metrics* metrics = nullptr;  // none: nothing is counted
  // Runs of a job the server died during; past it the job fails instead of running again.
  int max_attempts = 3;
};

class JobManager {
 public:
  // Every job's model runs through `runner` (the server's: a sandboxed worker process).
  JobManager(store::MetadataStore* metadata, store::BlobStore* blobs, ModelRegistry* models,
             JobRunner* runner, JobManagerOptions options);
  ~JobManager();

  // Re-queues jobs a previous process left running, queues the waiting ones, starts workers.
  absl::Status Start();
  // Refuses new work, stops workers at their next batch boundary (their jobs go back to
  // QUEUED for the next start) and ends watches. Returns when the workers have stopped or
  // `deadline` has passed.
  void Shutdown(absl::Duration deadline);

  absl::StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::Job> Get(const std::string& id);
  absl::StatusOr<store::JobPage> List(const std::vector<v1::JobState>& states, int page_size,
                                      const std::string& page_token);
  absl::StatusOr<v1::Job> Cancel(const std::string& id);

  // Queues one pushed batch for a client_stream job (blocks while its queue is full).
  // FAILED_PRECONDITION if the job does not take a client stream or has ended.
  absl::Status PushBatch(const std::string& id,
                         const google::protobuf::RepeatedPtrField<v1::Tensor>& inputs, bool last);

  // Delivers a snapshot of the job (its seq is after_seq: it does not advance), then every
  // event with seq > after_seq, until the terminal state has been delivered (OK), `deliver`
  // returns false or `stopped()` becomes true (CANCELLED), or the server shuts down
  // (UNAVAILABLE).
  absl::Status Watch(const std::string& id, int64_t after_seq,
                     const std::function<bool(const v1::JobEvent&)>& deliver,
                     const std::function<bool()>& stopped);

  // The stored artifact of a SUCCEEDED job (FAILED_PRECONDITION otherwise) and its file.
  absl::StatusOr<store::ResultRef> Result(const std::string& id, v1::Artifact artifact);
  std::string BlobPath(const std::string& sha256) const { return blobs_->PathOf(sha256); }

  int queued() const { return queue_.size(); }
  int running() const;

 private:
  struct Running {
    std::atomic<bool> cancel{false};
    std::atomic<bool> by_user{false};
  };
  struct Outputs;

  void WorkerLoop(std::string device);
  void RunJob(const std::string& id, const std::string& device);
  absl::StatusOr<Outputs> Execute(const v1::Job& job, const std::string& device, Running& running);
  // Stores `job` (already changed by the caller) with `event`, then wakes watchers.
  absl::Status Record(const v1::Job& job, v1::JobEvent event);
  absl::Status RecordState(v1::Job& job, v1::JobState state);
  // The end of a run: `last_event` (summary, failure) then `state`, retried a few times; a
  // store that keeps failing is logged as an error and the job stays RUNNING there, for the
  // next start to take up. True once stored.
  bool RecordEnd(v1::Job& job, const std::optional<v1::JobEvent>& last_event, v1::JobState state);
  absl::Status ValidateSpec(const v1::JobSpec& spec);
  // Logs and counts a job that has just reached a terminal state.
  void Finished(const v1::Job& job);
  // The feed of a client_stream job, made on first use (caller holds mu_).
  std::shared_ptr<StreamFeed> FeedLocked(const v1::Job& job);
  void CloseFeedLocked(const std::string& id, const absl::Status& reason);

  store::MetadataStore* metadata_;
  store::BlobStore* blobs_;
  ModelRegistry* models_;
  JobRunner* runner_;
  const JobManagerOptions options_;
  JobQueue queue_;

  // Serialises state transitions (submit, cancel, start, finish) so that none is lost.
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Running>> running_;
  std::map<std::string, std::shared_ptr<StreamFeed>> feeds_;
  std::vector<std::thread> workers_;
  bool started_ = false;
  std::atomic<bool> stopping_{false};

  // Watchers wait here for the next recorded event.
  EventHub events_;

  std::mutex workers_mu_;
  std::condition_variable workers_cv_;
  int active_workers_ = 0;
};

bool IsTerminal(v1::JobState state);

}  // namespace recal::jobs
