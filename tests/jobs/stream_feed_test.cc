// The feed between PushBatches and a client_stream job's runner: how long the runner waits.
#include "server/jobs/stream_feed.h"

#include <chrono>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace recal::jobs {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

google::protobuf::RepeatedPtrField<v1::Tensor> OneBatch() {
  google::protobuf::RepeatedPtrField<v1::Tensor> inputs;
  v1::Tensor* input = inputs.Add();
  input->set_dtype(v1::Tensor::FLOAT32);
  input->add_shape(2);
  input->add_shape(3);
  input->set_data(std::string(2 * 3 * 4, '\0'));
  return inputs;
}

TEST(StreamFeedTest, WaitingPastTheIdleTimeFailsNamingTheSetting) {
  StreamFeed feed(v1::ClientStreamSource(), 1 << 20);
  feed.set_deadline(Clock::time_point::max(), std::chrono::milliseconds(100), "--stream_idle_seconds");
  const auto start = Clock::now();
  auto next = feed.Next();
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(100));
  ASSERT_EQ(next.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(next.status().message(), HasSubstr("no batch was pushed for 100ms"));
  EXPECT_THAT(next.status().message(), HasSubstr("--stream_idle_seconds"));
}

TEST(StreamFeedTest, EachPushRestartsTheIdleTime) {
  StreamFeed feed(v1::ClientStreamSource(), 1 << 20);
  feed.set_deadline(Clock::time_point::max(), std::chrono::milliseconds(300), "--stream_idle_seconds");
  std::thread client([&] {
    for (int i = 0; i < 4; ++i) {  // 4 x 150 ms: longer than the idle time in all, never between two
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      auto inputs = OneBatch();
      ASSERT_TRUE(feed.Push(inputs, i == 3).ok());
    }
  });
  int batches = 0;
  while (true) {
    auto next = feed.Next();
    ASSERT_TRUE(next.ok()) << next.status();
    if (!next->has_value()) break;
    ++batches;
  }
  client.join();
  EXPECT_EQ(batches, 4);
}

TEST(StreamFeedTest, TheJobsTimeoutComesFirstWhenItIsSooner) {
  StreamFeed feed(v1::ClientStreamSource(), 1 << 20);
  feed.set_deadline(Clock::now() + std::chrono::milliseconds(50), std::chrono::hours(1), "--stream_idle_seconds");
  auto next = feed.Next();
  ASSERT_EQ(next.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(next.status().message(), HasSubstr("timeout"));
}

}  // namespace
}  // namespace recal::jobs
