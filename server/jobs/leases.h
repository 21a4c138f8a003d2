// The leases a process's runs hold on their jobs in the store, so that a job whose worker
// died is run again: a worker claims a job under a lease, a heartbeat renews it while the
// job runs, and the reaper puts back in the queue the jobs whose lease has ended (their
// worker stopped renewing: it died, or lost the store).
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/job_repository.h"
#include "server/jobs/scheduler_options.h"
#include "server/jobs/wake_signal.h"

namespace recal::jobs {

// What stops a run, set from outside it: a cancel (here, or seen in the store by the
// heartbeat), a shutdown, a lost lease.
struct RunFlags {
  std::atomic<bool> cancel{false};
  std::atomic<bool> by_user{false};
  std::atomic<bool> lease_lost{false};  // another worker may have the job now: write nothing
};

// The name a process's leases carry: `owner`, or, when empty, its host, pid and a random part.
std::string LeaseOwner(std::string owner);

class Leases {
 public:
  // `options` (owner already named, LeaseOwner), `wake` and `stopping` outlive this.
  Leases(JobRepository* jobs, const SchedulerOptions& options, WakeSignal* wake, const std::atomic<bool>& stopping);
  ~Leases();

  // The next job `device` runs (`kind`), leased to this process; nullopt when none waits.
  absl::StatusOr<std::optional<v1::Job>> Claim(const std::string& device, store::ClaimKind kind);
  // A new lease on a job of this process: its state in the store (CANCELLING: cancelled
  // elsewhere). FAILED_PRECONDITION or NOT_FOUND: the lease is not this process's any more.
  absl::StatusOr<v1::JobState> Renew(const std::string& id);
  // At start: the jobs a previous process left RUNNING back to the queue (all of them, or
  // only those whose lease has ended: SchedulerOptions::recover_all_at_start).
  absl::Status RecoverAtStart();
  // A thread that, every poll interval and at every wake, puts back the jobs whose lease has
  // ended, until `stopping`; StopReaper joins it.
  void StartReaper();
  void StopReaper();

  const SchedulerOptions& options() const { return options_; }

 private:
  void ReaperLoop();
  // Logs (and counts) the jobs a recovery put back or ended (past max_attempts).
  void Recovered(const std::vector<v1::Job>& jobs, bool at_start);

  JobRepository* jobs_;
  const SchedulerOptions& options_;
  WakeSignal* wake_;
  const std::atomic<bool>& stopping_;
  std::thread reaper_;
};

// Renews a claimed job's lease from a thread of its own for as long as it lives (the run's
// length); turns a cancel seen in the store, or a lost lease, into `flags`.
class LeaseHeartbeat {
 public:
  LeaseHeartbeat(Leases& leases, std::string id, RunFlags& flags);
  ~LeaseHeartbeat();  // stops renewing

  // Runs `store_end` (one attempt at storing the job's end, which releases the lease) with no
  // renewal in flight beside it. Once an attempt succeeds the heartbeat renews no more: a
  // renewal that raced the write would find the lease gone and call it lost, falsely.
  template <typename StoreEnd>
  auto Ending(StoreEnd store_end) {
    std::lock_guard<std::mutex> lock(renew_mu_);
    auto ended = store_end();
    if (ended.ok()) ended_ = true;
    return ended;
  }

 private:
  void Beat();
  // False once the heartbeat is stopped.
  bool Sleep(absl::Duration duration);
  // Renews the lease, unless the job's end is stored (nullopt then).
  std::optional<absl::StatusOr<v1::JobState>> RenewUnlessEnded();

  Leases& leases_;
  const std::string id_;
  RunFlags& flags_;
  std::mutex mu_;
  std::condition_variable stopped_;
  bool stop_ = false;
  std::mutex renew_mu_;  // a renewal and an attempt at storing the end, one at a time
  bool ended_ = false;   // guarded by renew_mu_
  std::thread thread_;   // last: started once the rest is made
};

}  // namespace recal::jobs
