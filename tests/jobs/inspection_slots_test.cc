#include "server/jobs/inspection_slots.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recal::jobs {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kCap = 1 << 20;

InspectionBounds Bounds(int host, int64_t memory_total, int per_tenant, absl::Duration wait = absl::Minutes(5)) {
  return InspectionBounds{host, memory_total, per_tenant, wait};
}

// Waits (without a timing assert) until `slots` has `n` waiters.
void AwaitQueued(const InspectionSlots& slots, int n) {
  while (slots.queued() != n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(InspectionSlotsTest, NeverRunsMoreThanTheHostCount) {
  InspectionSlots slots(Bounds(2, 0, 0, absl::Milliseconds(1)));
  auto a = slots.Acquire("a", kCap);
  auto b = slots.Acquire("b", kCap);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = slots.Acquire("c", kCap);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("--max_concurrent_inspections"));
  EXPECT_THAT(c.status().message(), HasSubstr("Retry the upload later"));
  EXPECT_EQ(slots.running(), 2);
  EXPECT_EQ(slots.refused(), 1);
}

TEST(InspectionSlotsTest, SumsTheMemoryCapsOfRunningInspections) {
  InspectionSlots slots(Bounds(0, 3 * kCap, 0, absl::Milliseconds(1)));
  auto a = slots.Acquire("a", 2 * kCap);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(slots.Acquire("a", 2 * kCap).status().code(), absl::StatusCode::kResourceExhausted);
  auto small = slots.Acquire("a", kCap);
  EXPECT_TRUE(small.ok());
  a->Release();
  EXPECT_TRUE(slots.Acquire("a", 2 * kCap).ok());
}

TEST(InspectionSlotsTest, RefusesAtOnceWhatCouldNeverFit) {
  InspectionSlots slots(Bounds(0, kCap, 0));
  auto too_big = slots.Acquire("a", 2 * kCap);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(too_big.status().message(), HasSubstr("--inspection_memory_total"));
}

TEST(InspectionSlotsTest, OneTenantFloodingLeavesASlotForAnother) {
  InspectionSlots slots(Bounds(3, 0, 2, absl::Milliseconds(1)));
  auto a1 = slots.Acquire("a", kCap);
  auto a2 = slots.Acquire("a", kCap);
  ASSERT_TRUE(a1.ok() && a2.ok());
  auto a3 = slots.Acquire("a", kCap);
  EXPECT_EQ(a3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(a3.status().message(), HasSubstr("max_concurrent_inspections in the auth file"));
  EXPECT_TRUE(slots.Acquire("b", kCap).ok());
}

TEST(InspectionSlotsTest, EachTenantHasItsOwnBound) {
  InspectionSlots slots(Bounds(0, 0, 0, absl::Milliseconds(1)));
  auto a = slots.Acquire("a", kCap, 1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(slots.Acquire("a", kCap, 1).status().code(), absl::StatusCode::kResourceExhausted);
  auto b1 = slots.Acquire("b", kCap, 2);
  auto b2 = slots.Acquire("b", kCap, 2);
  EXPECT_TRUE(b1.ok() && b2.ok());
  EXPECT_TRUE(slots.Acquire("c", kCap, 0).ok());  // 0: no bound for this tenant
}

TEST(InspectionSlotsTest, AWaiterStartsWhenASlotIsGivenBack) {
  InspectionSlots slots(Bounds(1, 0, 0));
  auto first = slots.Acquire("a", kCap);
  ASSERT_TRUE(first.ok());
  absl::StatusOr<InspectionSlots::Slot> second;
  std::thread waiter([&] { second = slots.Acquire("b", kCap); });
  AwaitQueued(slots, 1);
  first->Release();
  waiter.join();
  EXPECT_TRUE(second.ok());
  EXPECT_EQ(slots.running(), 1);
}

TEST(InspectionSlotsTest, WaitersStartInArrivalOrder) {
  InspectionSlots slots(Bounds(1, 0, 0));
  auto holder = slots.Acquire("x", kCap);
  ASSERT_TRUE(holder.ok());
  std::mutex order_mu;
  std::vector<std::string> order;
  std::vector<std::thread> threads;
  for (const std::string tenant : {"t0", "t1", "t2", "t3"}) {
    const int before = slots.queued();
    threads.emplace_back([&, tenant] {
      auto slot = slots.Acquire(tenant, kCap);
      ASSERT_TRUE(slot.ok());
      std::lock_guard<std::mutex> lock(order_mu);
      order.push_back(tenant);
    });
    AwaitQueued(slots, before + 1);
  }
  holder->Release();
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(order, ::testing::ElementsAre("t0", "t1", "t2", "t3"));
}

TEST(InspectionSlotsTest, ATenantAtItsBoundDoesNotHoldUpTheQueue) {
  InspectionSlots slots(Bounds(2, 0, 1));
  auto a1 = slots.Acquire("a", kCap);
  auto other = slots.Acquire("c", kCap);
  ASSERT_TRUE(a1.ok() && other.ok());
  absl::StatusOr<InspectionSlots::Slot> a2, b1;
  std::thread a_waiter([&] { a2 = slots.Acquire("a", kCap); });  // first in line, but "a" is at its bound
  AwaitQueued(slots, 1);
  std::thread b_waiter([&] { b1 = slots.Acquire("b", kCap); });
  AwaitQueued(slots, 2);
  other->Release();  // one host slot frees: it goes to "b", since "a" still runs one
  b_waiter.join();
  EXPECT_TRUE(b1.ok());
  EXPECT_EQ(slots.queued(), 1);
  a1->Release();
  b1->Release();
  a_waiter.join();
  EXPECT_TRUE(a2.ok());
}

TEST(InspectionSlotsTest, TheWaitIsBounded) {
  InspectionSlots slots(Bounds(1, 0, 0, absl::Milliseconds(20)));
  auto holder = slots.Acquire("a", kCap);
  ASSERT_TRUE(holder.ok());
  auto late = slots.Acquire("b", kCap);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(slots.queued(), 0);
  EXPECT_EQ(slots.running(), 1);
}

TEST(InspectionSlotsTest, ShutdownReleasesEveryWaiter) {
  InspectionSlots slots(Bounds(1, 0, 0));
  auto holder = slots.Acquire("a", kCap);
  ASSERT_TRUE(holder.ok());
  std::vector<absl::StatusOr<InspectionSlots::Slot>> results(3);
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) threads.emplace_back([&, i] { results[i] = slots.Acquire("b", kCap); });
  AwaitQueued(slots, 3);
  slots.Shutdown();
  for (std::thread& t : threads) t.join();
  for (const auto& result : results) EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(slots.Acquire("c", kCap).status().code(), absl::StatusCode::kUnavailable);
}

TEST(InspectionSlotsTest, AMovedSlotIsGivenBackOnce) {
  InspectionSlots slots(Bounds(1, 0, 0, absl::Milliseconds(1)));
  {
    auto slot = slots.Acquire("a", kCap);
    ASSERT_TRUE(slot.ok());
    InspectionSlots::Slot moved = std::move(*slot);
    EXPECT_EQ(slots.running(), 1);
  }
  EXPECT_EQ(slots.running(), 0);
  EXPECT_TRUE(slots.Acquire("a", kCap).ok());
}

}  // namespace
}  // namespace recal::jobs
