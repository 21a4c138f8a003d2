#include "server/jobs/job_finished.h"

#include "common/now.h"
#include "server/log/log.h"
#include "server/metrics/metrics.h"

namespace recal::jobs {

void JobFinished(const v1::Job& job, metrics::Metrics* metrics) {
  const bool started = job.has_start_time();
  const double duration = started ? SecondsBetween(job.start_time(), job.end_time()) : 0;
  if (metrics) {
    metrics->JobsFinished(v1::JobState_Name(job.state()), job.tenant()).Increment();
    if (started) metrics->job_duration_seconds.Observe(duration);
  }
  log::Fields fields = {{"job_id", job.id()}, {"state", v1::JobState_Name(job.state())}};
  if (started) fields.emplace_back("duration_seconds", duration);
  if (job.has_progress()) {
    fields.emplace_back("batches", job.progress().batches_done());
    fields.emplace_back("samples", job.progress().samples_done());
  }
  if (job.has_error()) fields.emplace_back("error", job.error().message());
  log::Write(job.state() == v1::FAILED ? log::Level::kWarning : log::Level::kInfo, "job finished", fields);
}

}  // namespace recal::jobs
