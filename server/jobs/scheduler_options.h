// How a process's Scheduler runs jobs: its devices, its queue's bound, the leases it holds,
// and where client streams' batches come from. Shared by the scheduler's parts (leases,
// shard coordination, runs).
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/jobs/resolved_data_source.h"
#include "server/store/metadata_store.h"

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

  // A job's timeout: its spec's, or default_timeout_seconds.
  double TimeoutFor(const v1::JobSpec& spec) const {
    return spec.timeout_seconds() > 0 ? spec.timeout_seconds() : default_timeout_seconds;
  }
};

}  // namespace recal::jobs
