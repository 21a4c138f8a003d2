#include "server/jobs/event_hub.h"

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace recal::jobs {
namespace {

TEST(EventHub, AWaiterWakesOnPublishAndOtherwiseAtItsTimeout) {
  EventHub hub;
  const int64_t seen = hub.version();
  auto start = std::chrono::steady_clock::now();
  hub.WaitForChange(seen, absl::Milliseconds(100));  // nothing published: the timeout
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(90));

  std::thread publisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    hub.PublishAll();
  });
  start = std::chrono::steady_clock::now();
  hub.WaitForChange(seen, absl::Seconds(30));
  publisher.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(hub.version(), seen);
  // Published before the wait began: no wait at all.
  start = std::chrono::steady_clock::now();
  hub.WaitForChange(seen, absl::Seconds(30));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(EventHub, ASubscriptionWakesOnceOnItsJobOnlyOrOnPublishAll) {
  EventHub hub;
  int woken_a = 0, woken_b = 0;
  hub.Subscribe("a", hub.version(), [&] { ++woken_a; });
  hub.Subscribe("b", hub.version(), [&] { ++woken_b; });
  hub.Publish("b");
  EXPECT_EQ(woken_a, 0);  // another job's publish does not wake it
  EXPECT_EQ(woken_b, 1);
  hub.Publish("b");
  EXPECT_EQ(woken_b, 1);  // once: it subscribes again to hear more
  EXPECT_EQ(hub.subscribers(), 1);
  hub.PublishAll();
  EXPECT_EQ(woken_a, 1);
  EXPECT_EQ(hub.subscribers(), 0);
}

TEST(EventHub, ASubscriptionAfterAChangeItHasNotSeenRunsAtOnce) {
  EventHub hub;
  const int64_t seen = hub.version();
  hub.Publish("a");  // between the watcher's read and its subscription
  bool woken = false;
  hub.Subscribe("a", seen, [&] { woken = true; });
  EXPECT_TRUE(woken);
  EXPECT_EQ(hub.subscribers(), 0);
}

TEST(EventHub, AnUnsubscribedWatcherIsNeverWoken) {
  EventHub hub;
  bool woken = false;
  const int64_t token = hub.Subscribe("a", hub.version(), [&] { woken = true; });
  EXPECT_TRUE(hub.Unsubscribe(token));
  EXPECT_FALSE(hub.Unsubscribe(token));
  hub.PublishAll();
  EXPECT_FALSE(woken);
  EXPECT_EQ(hub.subscribers(), 0);
}

}  // namespace
}  // namespace recal::jobs
