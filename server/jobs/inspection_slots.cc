#include "server/jobs/inspection_slots.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace recal::jobs {

InspectionSlots::Slot& InspectionSlots::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = std::exchange(other.owner_, nullptr);
    tenant_ = std::move(other.tenant_);
    memory_bytes_ = other.memory_bytes_;
  }
  return *this;
}

void InspectionSlots::Slot::Release() {
  if (owner_ != nullptr) std::exchange(owner_, nullptr)->Give(tenant_, memory_bytes_);
}

bool InspectionSlots::HostFits(int64_t memory_bytes) const {
  if (bounds_.max_concurrent > 0 && running_ >= bounds_.max_concurrent) return false;
  return bounds_.memory_total_bytes <= 0 || memory_in_use_ + memory_bytes <= bounds_.memory_total_bytes;
}

bool InspectionSlots::TenantFits(const std::string& tenant, int tenant_limit) const {
  if (tenant_limit <= 0) return true;
  auto it = running_by_tenant_.find(tenant);
  return it == running_by_tenant_.end() || it->second < tenant_limit;
}

InspectionSlots::Blocker InspectionSlots::BlockerOf(std::list<Waiter>::const_iterator self) const {
  if (!TenantFits(self->tenant, self->tenant_limit)) return Blocker::kTenantBound;
  if (!HostFits(self->memory_bytes)) return Blocker::kHostBound;
  // Arrival order among the waiters that could start: an earlier one whose tenant is at its
  // own bound waits for that tenant, not for the host, so it does not hold up this one.
  for (auto it = waiting_.begin(); it != self; ++it) {
    if (TenantFits(it->tenant, it->tenant_limit) && HostFits(it->memory_bytes)) return Blocker::kEarlierWaiter;
  }
  return Blocker::kNothing;
}

absl::StatusOr<InspectionSlots::Slot> InspectionSlots::Acquire(const std::string& tenant, int64_t memory_bytes,
                                                               int tenant_limit) {
  if (tenant_limit < 0) tenant_limit = bounds_.max_per_tenant;
  std::unique_lock<std::mutex> lock(mu_);
  if (shut_down_) return absl::UnavailableError("the server is shutting down; retry the upload later");
  if (bounds_.memory_total_bytes > 0 && memory_bytes > bounds_.memory_total_bytes) {
    ++refused_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "an inspection's memory cap (", memory_bytes, " bytes, --inspection_memory_bytes) exceeds what this host "
        "lends all inspections together (", bounds_.memory_total_bytes, " bytes, --inspection_memory_total)"));
  }
  auto self = waiting_.insert(waiting_.end(), Waiter{tenant, memory_bytes, tenant_limit});
  const absl::Time deadline = absl::Now() + bounds_.max_wait;
  // The bound that last held it back: what a refusal names. At the deadline it may be behind
  // an earlier waiter that a slot just freed has not woken yet; the bound is still the cause.
  Blocker bound = tenant_limit > 0 ? Blocker::kTenantBound : Blocker::kHostBound;
  auto blocked = [&] {
    const Blocker blocker = BlockerOf(self);
    if (blocker == Blocker::kTenantBound || blocker == Blocker::kHostBound) bound = blocker;
    return blocker != Blocker::kNothing;
  };
  while (!shut_down_ && blocked()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    changed_.wait_for(lock, absl::ToChronoNanoseconds(left));
  }
  const bool may_start = !shut_down_ && !blocked();
  waiting_.erase(self);
  // Leaving the queue may let the waiter behind start.
  changed_.notify_all();
  if (shut_down_) return absl::UnavailableError("the server is shutting down; retry the upload later");
  if (!may_start) {
    ++refused_;
    const bool tenant_bound = bound == Blocker::kTenantBound;
    return absl::ResourceExhaustedError(absl::StrCat(
        tenant_bound ? absl::StrCat("tenant ", tenant, " already has ", tenant_limit,
                                    " inspections running (max_concurrent_inspections in the auth file, or "
                                    "--tenant_max_concurrent_inspections)")
                     : absl::StrCat(running_, " inspections are running on this host (--max_concurrent_inspections=",
                                    bounds_.max_concurrent, ", --inspection_memory_total=",
                                    bounds_.memory_total_bytes, ")"),
        "; waited ", absl::FormatDuration(bounds_.max_wait),
        " for a slot. Retry the upload later: its staged bytes are kept"));
  }
  ++running_;
  ++running_by_tenant_[tenant];
  memory_in_use_ += memory_bytes;
  return Slot(this, tenant, memory_bytes);
}

void InspectionSlots::Give(const std::string& tenant, int64_t memory_bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    memory_in_use_ -= memory_bytes;
    auto it = running_by_tenant_.find(tenant);
    if (it != running_by_tenant_.end() && --it->second <= 0) running_by_tenant_.erase(it);
  }
  changed_.notify_all();
}

void InspectionSlots::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
  }
  changed_.notify_all();
}

int InspectionSlots::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

int InspectionSlots::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(waiting_.size());
}

int64_t InspectionSlots::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

}  // namespace recal::jobs
