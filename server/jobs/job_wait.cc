#include "server/jobs/job_wait.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace recal::jobs {
namespace {

// "1 job" / "3 jobs", and the verb that goes with it.
std::string Jobs(int64_t n, const char* one_verb = "", const char* many_verb = "") {
  return n == 1 ? absl::StrCat("1 job", one_verb) : absl::StrCat(n, " jobs", many_verb);
}

std::string NoWorkerReason() {
  return absl::StrCat("no worker has been heard from in the last ",
                      absl::ToInt64Seconds(store::kWorkerEndpointLiveWithin),
                      " s: start a worker (recal-server --role worker) or check its logs");
}

// A sharded job's parent waits for a coordinator thread of a worker process (ClaimKind::kCoordinate).
std::string CoordinatorReason(const v1::JobWait& wait) {
  const std::string ahead =
      wait.jobs_ahead() == 0 ? "" : absl::StrCat(" (sharded jobs ahead of it: ", wait.jobs_ahead(), ")");
  return absl::StrCat("it waits for a worker's coordinator to take it up", ahead,
                      "; its shards queue as jobs of their own (each shard's status says why it waits)");
}

// A plain job's or a shard's wait, once a worker is known to exist: its cause and reason.
void ExplainRunWait(v1::JobWait& wait) {
  if (wait.tenant_max_running() > 0 && wait.tenant_running() >= wait.tenant_max_running()) {
    wait.set_cause(v1::JobWait::TENANT_AT_BOUND);
    wait.set_reason(absl::StrCat("its tenant already runs ", Jobs(wait.tenant_running()),
                                 ", its bound (max_running_jobs in the auth file, or the server's "
                                 "--tenant_max_running_jobs): it starts when one of them ends"));
    return;
  }
  const std::string running = absl::StrCat(Jobs(wait.jobs_running(), " runs", " run"), " now");
  if (wait.jobs_ahead() > 0) {
    wait.set_cause(v1::JobWait::JOBS_AHEAD);
    wait.set_reason(
        absl::StrCat(Jobs(wait.jobs_ahead(), " is", " are"), " ahead of it (by priority, then age); ", running));
    return;
  }
  if (wait.jobs_running() > 0) {
    wait.set_cause(v1::JobWait::NEXT_IN_LINE);
    wait.set_reason(absl::StrCat("it is next in line (", running, "): the next worker that is free takes it"));
    return;
  }
  wait.set_cause(v1::JobWait::STARTING);
  wait.set_reason("it is next in line: an idle worker takes it up within moments");
}

}  // namespace

v1::JobWait DescribeWait(const v1::Job& job, const store::QueueCounts& counts, int64_t tenant_max_running,
                         bool workers_here) {
  v1::JobWait wait;
  wait.set_jobs_ahead(static_cast<int32_t>(counts.jobs_ahead));
  wait.set_tenant_running(static_cast<int32_t>(counts.tenant_running));
  wait.set_tenant_max_running(static_cast<int32_t>(tenant_max_running));
  wait.set_jobs_running(static_cast<int32_t>(counts.jobs_running));
  if (!workers_here && counts.workers_heard == 0) {
    wait.set_cause(v1::JobWait::NO_WORKER);
    wait.set_reason(NoWorkerReason());
  } else if (store::IsCoordinated(job)) {
    wait.set_cause(v1::JobWait::COORDINATOR);
    wait.set_reason(CoordinatorReason(wait));
  } else {
    ExplainRunWait(wait);
  }
  return wait;
}

}  // namespace recal::jobs
