// The job queue's order, bound, removal and closing.
#include "server/jobs/job_queue.h"

#include <string>
#include <thread>
#include <vector>

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

TEST(JobQueue, WithinAPriorityTenantsTakeTurnsAndEachKeepsItsOrder) {
  JobQueue queue(100);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(queue.Push("a" + std::to_string(i), 0, false, "tenant-a").ok());
  ASSERT_TRUE(queue.Push("b0", 0, false, "tenant-b").ok());
  ASSERT_TRUE(queue.Push("b1", 0, false, "tenant-b").ok());
  ASSERT_TRUE(queue.Push("urgent", 1, false, "tenant-a").ok());
  std::vector<std::string> order;
  for (int i = 0; i < 8; ++i) order.push_back(*queue.Pop());
  // Priority first; then a and b alternate (b had not been served, a just had), each FIFO.
  EXPECT_EQ(order, (std::vector<std::string>{"urgent", "b0", "a0", "b1", "a1", "a2", "a3", "a4"}));
  // A tenant arriving later is still served before the busy one's next job.
  ASSERT_TRUE(queue.Push("a5", 0, false, "tenant-a").ok());
  ASSERT_TRUE(queue.Push("a6", 0, false, "tenant-a").ok());
  ASSERT_TRUE(queue.Push("c0", 0, false, "tenant-c").ok());
  EXPECT_EQ(*queue.Pop(), "c0");
  EXPECT_EQ(*queue.Pop(), "a5");
}

}  // namespace
}  // namespace recal::jobs
