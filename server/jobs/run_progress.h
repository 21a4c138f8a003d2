// A run's progress, from the worker's events into the store (what watchers and GetJob see)
// and the metrics: throttled to SchedulerOptions::progress_interval, the last event always.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "recal/v1/recal.pb.h"
#include "recal/worker/v1/worker.pb.h"
#include "server/jobs/job_repository.h"
#include "server/jobs/scheduler_options.h"

namespace recal::jobs {

class RunProgress {
 public:
  // From now: the rates are over the time since.
  RunProgress(JobRepository* jobs, const v1::Job& job, const SchedulerOptions& options);

  // After every batch (RunHooks::on_progress).
  void OnEvent(const worker::v1::Progress& event);
  // After a run that succeeded: the data ended before the expected count (skipped files, a
  // stream, early stopping) or the last event was throttled away, so the last event is
  // published as where the run really ended.
  void Finish();

 private:
  void Publish(const worker::v1::Progress& event, int64_t total);
  double Elapsed() const;

  JobRepository* jobs_;
  const v1::Job& job_;
  const SchedulerOptions& options_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_published_ = start_ - std::chrono::hours(1);
  int64_t counted_batches_ = 0;
  int64_t counted_samples_ = 0;
  std::optional<worker::v1::Progress> latest_;
  bool latest_published_as_final_ = false;
};

}  // namespace recal::jobs
