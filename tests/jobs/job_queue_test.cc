// The job queue's order, bound, removal and closing.
#include "server/jobs/job_queue.h"

#include <thread>

#include <gtest/gtest.h>

namespace recal::jobs {
namespace {

TEST(JobQueue, HighestPriorityFirstThenArrivalOrder) {
  JobQueue queue(10);
  ASSERT_TRUE(queue.Push("low-1", 0).ok());
  ASSERT_TRUE(queue.Push("high", 5).ok());
  ASSERT_TRUE(queue.Push("low-2", 0).ok());
  ASSERT_TRUE(queue.Push("negative", -1).ok());
  EXPECT_EQ(*queue.Pop(), "high");
  EXPECT_EQ(*queue.Pop(), "low-1");
  EXPECT_EQ(*queue.Pop(), "low-2");
  EXPECT_EQ(*queue.Pop(), "negative");
}

TEST(JobQueue, IsBoundedUnlessForced) {
  JobQueue queue(2);
  ASSERT_TRUE(queue.Push("a", 0).ok());
  ASSERT_TRUE(queue.Push("b", 0).ok());
  absl::Status full = queue.Push("c", 0);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("max_queued_jobs"), std::string::npos);
  EXPECT_TRUE(queue.Push("recovered", 0, /*force=*/true).ok());
  EXPECT_EQ(queue.size(), 3);
}

TEST(JobQueue, RemovedJobsAreNotPopped) {
  JobQueue queue(10);
  ASSERT_TRUE(queue.Push("a", 0).ok());
  ASSERT_TRUE(queue.Push("b", 0).ok());
  EXPECT_TRUE(queue.Remove("a"));
  EXPECT_FALSE(queue.Remove("a"));
  EXPECT_EQ(*queue.Pop(), "b");
}

TEST(JobQueue, CloseWakesWaitingWorkers) {
  JobQueue queue(10);
  std::optional<std::string> popped = "not yet";
  std::thread worker([&] { popped = queue.Pop(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  queue.Close();
  worker.join();
  EXPECT_FALSE(popped.has_value());
}

}  // namespace
}  // namespace recal::jobs
