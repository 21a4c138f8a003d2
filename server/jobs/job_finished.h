// The one place a job's end is logged and counted, whoever ended it (a run, the reaper, a
// cancel, start-up recovery).
#pragma once

#include "recal/v1/recal.pb.h"

namespace recal::metrics {
struct Metrics;
}

namespace recal::jobs {

// Logs and counts (when `metrics`) a job that has just reached a terminal state.
void JobFinished(const v1::Job& job, metrics::Metrics* metrics);

}  // namespace recal::jobs
