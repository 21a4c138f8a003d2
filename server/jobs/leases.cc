#include "server/jobs/leases.h"

#include <unistd.h>

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/jobs/job_finished.h"
#include "server/log/log.h"
#include "server/metrics/metrics.h"

namespace recal::jobs {

std::string LeaseOwner(std::string owner) {
  if (!owner.empty()) return owner;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  absl::BitGen random;
  return absl::StrFormat("%s:%d:%08x", host, ::getpid(), absl::Uniform<uint32_t>(random));
}

Leases::Leases(JobRepository* jobs, const SchedulerOptions& options, WakeSignal* wake,
               const std::atomic<bool>& stopping)
    : jobs_(jobs), options_(options), wake_(wake), stopping_(stopping) {}

Leases::~Leases() { StopReaper(); }

absl::StatusOr<std::optional<v1::Job>> Leases::Claim(const std::string& device, store::ClaimKind kind) {
  return jobs_->Claim(device, options_.owner, absl::ToUnixMillis(absl::Now() + options_.lease), kind,
                      options_.max_running_jobs);
}

absl::StatusOr<v1::JobState> Leases::Renew(const std::string& id) {
  return jobs_->Renew(id, options_.owner, absl::ToUnixMillis(absl::Now() + options_.lease));
}

absl::Status Leases::RecoverAtStart() {
  RECAL_ASSIGN_OR_RETURN(const std::vector<v1::Job> recovered,
                         options_.recover_all_at_start
                             ? jobs_->RecoverInterrupted(options_.max_attempts)
                             : jobs_->RecoverExpired(absl::ToUnixMillis(absl::Now()), options_.max_attempts));
  Recovered(recovered, /*at_start=*/true);
  return absl::OkStatus();
}

void Leases::StartReaper() {
  reaper_ = std::thread([this] { ReaperLoop(); });
}

void Leases::StopReaper() {
  if (reaper_.joinable()) reaper_.join();
}

void Leases::ReaperLoop() {
  while (!stopping_) {
    wake_->WaitAfter(wake_->Count(), options_.poll_interval, stopping_);
    if (stopping_) break;
    auto recovered = jobs_->RecoverExpired(absl::ToUnixMillis(absl::Now()), options_.max_attempts);
    if (!recovered.ok()) {
      log::Warning("expired leases not recovered", {{"error", std::string(recovered.status().message())}});
      continue;
    }
    Recovered(*recovered, /*at_start=*/false);
  }
}

void Leases::Recovered(const std::vector<v1::Job>& jobs, bool at_start) {
  for (const v1::Job& job : jobs) {
    if (IsTerminal(job.state())) {
      JobFinished(job, options_.metrics);
    } else if (at_start) {
      log::Info("job re-queued at start-up", {{"job_id", job.id()}, {"attempts", job.attempts()}});
    } else {
      log::Info("job re-queued: its worker stopped renewing its lease",
                {{"job_id", job.id()}, {"attempts", job.attempts()}});
      if (options_.metrics) options_.metrics->leases_expired.Increment();
      wake_->Wake();
    }
  }
}

LeaseHeartbeat::LeaseHeartbeat(Leases& leases, std::string id, RunFlags& flags)
    : leases_(leases), id_(std::move(id)), flags_(flags), thread_([this] { Beat(); }) {}

LeaseHeartbeat::~LeaseHeartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  stopped_.notify_all();
  thread_.join();
}

bool LeaseHeartbeat::Sleep(absl::Duration duration) {
  std::unique_lock<std::mutex> lock(mu_);
  return !stopped_.wait_for(lock, absl::ToChronoMilliseconds(duration), [&] { return stop_; });
}

std::optional<absl::StatusOr<v1::JobState>> LeaseHeartbeat::RenewUnlessEnded() {
  std::lock_guard<std::mutex> lock(renew_mu_);
  if (ended_) return std::nullopt;
  return leases_.Renew(id_);
}

void LeaseHeartbeat::Beat() {
  const SchedulerOptions& options = leases_.options();
  const absl::Duration every = std::min(options.lease / 3, absl::Seconds(1));
  absl::Time last_renewed = absl::Now();
  // Not stopped by a shutdown: the run ends on its own (cancelled) and the lease is kept till then.
  while (Sleep(every)) {
    std::optional<absl::StatusOr<v1::JobState>> renewed = RenewUnlessEnded();
    if (!renewed) return;  // released by the run's end, not lost
    const absl::StatusOr<v1::JobState>& state = *renewed;
    if (state.ok()) {
      last_renewed = absl::Now();
      if (*state == v1::CANCELLING && !flags_.cancel) {
        flags_.by_user = true;
        flags_.cancel = true;
      }
      continue;
    }
    // Lost (expired and taken back), or the store unreachable for a whole lease: another
    // worker may run the job now, so this one stops and writes nothing.
    if (absl::IsFailedPrecondition(state.status()) || absl::IsNotFound(state.status()) ||
        absl::Now() - last_renewed > options.lease) {
      log::Warning("job lease lost: stopping its run", {{"job_id", id_}, {"error", std::string(state.status().message())}});
      flags_.lease_lost = true;
      flags_.cancel = true;
      if (options.metrics) options.metrics->leases_lost.Increment();
      return;
    }
  }
}

}  // namespace recal::jobs
