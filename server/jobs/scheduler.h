// Runs queued jobs: one worker thread per device takes the next job from the queue (highest
// priority first, FIFO within a priority), starts it in the repository, hands it to the
// JobRunner (the sandboxed worker process) with its model, data, scratch directory, timeout
// and cancellation, and ends it in the repository with the results the runner left in
// scratch adopted into the blob store.
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
#include "server/jobs/job_queue.h"
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
  absl::Duration progress_interval = absl::Milliseconds(250);
  metrics::Metrics* metrics = nullptr;  // none: nothing is counted
  // Runs of a job the server died during; past it the job fails instead of running again.
  int max_attempts = 3;
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
  // A job just created QUEUED.
  void Enqueue(const v1::Job& job);
  // A job just cancelled: leaves the queue, or its runner is stopped.
  void Cancel(const std::string& id);

  int queued() const { return queue_.size(); }
  int running() const;

 private:
  struct Running {
    std::atomic<bool> cancel{false};
    std::atomic<bool> by_user{false};
  };
  struct Outputs {
    std::map<v1::Artifact, store::ResultRef> results;
    v1::RunReport report;
  };

  void WorkerLoop(const std::string& device);
  void RunJob(const std::string& id, const std::string& device);
  absl::StatusOr<Outputs> Execute(const v1::Job& job, const std::string& device, Running& running);

  JobRepository* jobs_;
  store::BlobStore* blobs_;
  ModelRegistry* models_;
  JobRunner* runner_;
  StreamFeeds* feeds_;
  const SchedulerOptions options_;
  JobQueue queue_;

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Running>> running_;
  std::vector<std::thread> workers_;
  bool started_ = false;
  std::atomic<bool> stopping_{false};

  std::mutex workers_mu_;
  std::condition_variable workers_cv_;
  int active_workers_ = 0;
};

}  // namespace recal::jobs
