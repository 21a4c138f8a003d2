// Admission for upload inspections on one host: each inspecting recal-worker holds a slot
// while it runs. Beyond the host's bound (a count, and the sum of the workers' memory caps)
// or one tenant's bound (a count), inspections wait in arrival order for a bounded time;
// a tenant at its own bound does not hold up the tenants behind it. Issue 35 item 2: one
// tenant's concurrent uploads must not take the machine from everyone.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace recal::jobs {

struct InspectionBounds {
  int max_concurrent = 0;           // inspections at once on the host; 0: no bound
  int64_t memory_total_bytes = 0;   // sum of the memory caps of running inspections; 0: no bound
  int max_per_tenant = 0;           // inspections at once of one tenant; 0: no bound
  absl::Duration max_wait = absl::Minutes(2);
};

class InspectionSlots {
 public:
  // Held while an inspection runs; gives its slot back when destroyed.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept { *this = std::move(other); }
    Slot& operator=(Slot&& other) noexcept;
    ~Slot() { Release(); }
    void Release();

   private:
    friend class InspectionSlots;
    Slot(InspectionSlots* owner, std::string tenant, int64_t memory_bytes)
        : owner_(owner), tenant_(std::move(tenant)), memory_bytes_(memory_bytes) {}
    InspectionSlots* owner_ = nullptr;
    std::string tenant_;
    int64_t memory_bytes_ = 0;
  };

  explicit InspectionSlots(InspectionBounds bounds) : bounds_(bounds) {}

  // A slot for an inspection of `tenant` whose worker may use `memory_bytes`, once one is
  // free, waiting at most `bounds.max_wait`. RESOURCE_EXHAUSTED when the wait ends or the
  // inspection could never fit (naming the flag that sets the bound, and saying to retry);
  // UNAVAILABLE once Shutdown() was called.
  // `tenant_limit`: this tenant's bound (its auth-file setting); -1: bounds.max_per_tenant.
  absl::StatusOr<Slot> Acquire(const std::string& tenant, int64_t memory_bytes, int tenant_limit = -1);
  // Wakes every waiter with UNAVAILABLE; later Acquire calls fail the same way.
  void Shutdown();

  int running() const;
  int queued() const;
  // Inspections refused since start (waited too long, or could never fit).
  int64_t refused() const;

 private:
  struct Waiter {
    std::string tenant;
    int64_t memory_bytes;
    int tenant_limit;  // 0: none
  };
  // What keeps a waiter from starting now.
  enum class Blocker { kNothing, kTenantBound, kHostBound, kEarlierWaiter };
  bool HostFits(int64_t memory_bytes) const;
  bool TenantFits(const std::string& tenant, int tenant_limit) const;
  // kNothing when `self` is the first waiter whose tenant is below its bound, and the host
  // fits it.
  Blocker BlockerOf(std::list<Waiter>::const_iterator self) const;
  void Give(const std::string& tenant, int64_t memory_bytes);

  const InspectionBounds bounds_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::list<Waiter> waiting_;
  std::map<std::string, int> running_by_tenant_;
  int running_ = 0;
  int64_t memory_in_use_ = 0;
  int64_t refused_ = 0;
  bool shut_down_ = false;
};

}  // namespace recal::jobs
