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
    hub.Publish();
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

}  // namespace
}  // namespace recal::jobs
