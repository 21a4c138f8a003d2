#include "server/jobs/run_progress.h"

#include <algorithm>
#include <cmath>

#include "server/metrics/metrics.h"

namespace recal::jobs {

RunProgress::RunProgress(JobRepository* jobs, const v1::Job& job, const SchedulerOptions& options)
    : jobs_(jobs), job_(job), options_(options) {}

double RunProgress::Elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void RunProgress::OnEvent(const worker::v1::Progress& event) {
  if (options_.metrics) {
    options_.metrics->batches_processed.Increment(static_cast<double>(event.batches() - counted_batches_));
    options_.metrics->samples_processed.Increment(static_cast<double>(event.samples() - counted_samples_));
  }
  counted_batches_ = event.batches();
  counted_samples_ = event.samples();
  const int64_t batch_size = job_.spec().batch_size();
  const int64_t total = event.total_samples() > 0
                            ? std::min(event.max_batches(), (event.total_samples() + batch_size - 1) / batch_size)
                            : event.max_batches();
  const bool last = event.batches() >= total;
  latest_ = event;
  latest_published_as_final_ = last;
  const auto now = std::chrono::steady_clock::now();
  if (!last && now - last_published_ < absl::ToChronoMilliseconds(options_.progress_interval)) return;
  last_published_ = now;
  Publish(event, total);
}

void RunProgress::Finish() {
  if (latest_ && !latest_published_as_final_) Publish(*latest_, latest_->batches());
}

void RunProgress::Publish(const worker::v1::Progress& event, int64_t total) {
  const double elapsed = Elapsed();
  v1::JobProgress progress;
  progress.set_batches_done(event.batches());
  progress.set_batches_total(total);
  progress.set_samples_done(event.samples());
  progress.set_samples_per_second(elapsed > 0 ? event.samples() / elapsed : 0);
  progress.set_eta_seconds(event.batches() > 0 ? elapsed / event.batches() * (total - event.batches()) : 0);
  progress.set_rel_std_error(std::isfinite(event.rel_std_error()) ? event.rel_std_error() : -1);
  // Progress is advice: a store that refuses it does not stop the job.
  jobs_->Progress(job_.id(), progress).IgnoreError();
}

}  // namespace recal::jobs
