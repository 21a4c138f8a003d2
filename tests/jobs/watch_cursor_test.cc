// A watcher's place in a job's events over a real SQLite store: the snapshot first, then
// every event after after_seq once and in order (across pages of the store), an empty step
// while nothing is new, and the end after the terminal state; a watcher that asks from past
// the job's end (or beyond any seq) is ended when the job is, not left waiting.
#include "server/jobs/watch_cursor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/jobs/job_store_fixture.h"

namespace recal::jobs {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class WatchCursorTest : public JobStoreTest {
 protected:
  void SetUp() override {
    JobStoreTest::SetUp();
    reads_ = std::make_unique<WatchReads>(jobs_.get(), &events_);
    Create("a");
  }
  WatchCursor Open(int64_t after_seq) { return WatchCursor(reads_.get(), *jobs_->Get("a"), after_seq); }
  void Succeed() { ASSERT_TRUE(jobs_->Succeed("a", {}, v1::RunReport()).ok()); }
  // "snapshot@seq", "state:RUNNING@seq", "progress:2@seq", "summary@seq" for each event.
  static std::vector<std::string> Describe(const std::vector<v1::JobEvent>& events) {
    std::vector<std::string> out;
    for (const v1::JobEvent& e : events) {
      std::string kind = "other";
      if (e.has_snapshot()) kind = "snapshot";
      if (e.kind_case() == v1::JobEvent::kState) kind = "state:" + v1::JobState_Name(e.state());
      if (e.kind_case() == v1::JobEvent::kProgress) kind = "progress:" + std::to_string(e.progress().batches_done());
      if (e.kind_case() == v1::JobEvent::kSummary) kind = "summary";
      out.push_back(kind + "@" + std::to_string(e.seq()));
    }
    return out;
  }
  // Steps until one is done or empty; all their events.
  static std::vector<v1::JobEvent> Drain(WatchCursor& cursor, bool* done) {
    std::vector<v1::JobEvent> all;
    while (true) {
      auto step = cursor.Next();
      EXPECT_TRUE(step.ok()) << step.status();
      if (!step.ok()) return all;
      for (v1::JobEvent& e : step->events) all.push_back(std::move(e));
      *done = step->done;
      if (step->done || step->events.empty()) return all;
    }
  }

  std::unique_ptr<WatchReads> reads_;
};

TEST_F(WatchCursorTest, TheSnapshotComesFirstThenEachNewEventOnceAndTheTerminalStateEndsIt) {
  WatchCursor cursor = Open(0);
  auto first = cursor.Next();
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->events.size(), 1u);
  EXPECT_TRUE(first->events[0].has_snapshot());
  EXPECT_EQ(first->events[0].seq(), 0);  // the snapshot does not advance the watcher
  EXPECT_EQ(first->events[0].snapshot().state(), v1::QUEUED);
  EXPECT_FALSE(first->done);

  bool done = true;
  EXPECT_THAT(Describe(Drain(cursor, &done)), ElementsAre("state:QUEUED@1"));
  EXPECT_FALSE(done);
  // Nothing new: an empty step, not done (the caller waits for the job to change).
  auto idle = cursor.Next();
  ASSERT_TRUE(idle.ok());
  EXPECT_THAT(idle->events, IsEmpty());
  EXPECT_FALSE(idle->done);

  ASSERT_TRUE(jobs_->Start("a", "cpu").ok());
  Progress("a", 1);
  EXPECT_THAT(Describe(Drain(cursor, &done)), ElementsAre("state:RUNNING@2", "progress:1@3"));
  EXPECT_FALSE(done);
  Progress("a", 2);
  Succeed();
  EXPECT_THAT(Describe(Drain(cursor, &done)),
              ElementsAre("progress:2@4", "summary@5", "state:SUCCEEDED@6"));
  EXPECT_TRUE(done);
  EXPECT_TRUE(cursor.done());
  // Once done, always done, with nothing more.
  auto after = cursor.Next();
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->done);
  EXPECT_THAT(after->events, IsEmpty());
}

TEST_F(WatchCursorTest, AResumedWatchStartsAfterItsSeqWithTheSnapshot) {
  ASSERT_TRUE(jobs_->Start("a", "cpu").ok());
  Progress("a", 1);
  Progress("a", 2);
  WatchCursor cursor = Open(2);
  bool done = true;
  EXPECT_THAT(Describe(Drain(cursor, &done)), ElementsAre("snapshot@2", "progress:1@3", "progress:2@4"));
  EXPECT_FALSE(done);
}

TEST_F(WatchCursorTest, EventsBeyondAStorePageAllArriveInOrderWithoutAGap) {
  ASSERT_TRUE(jobs_->Start("a", "cpu").ok());
  constexpr int kProgress = 300;  // more than a page of the cursor's reads (256)
  for (int i = 1; i <= kProgress; ++i) Progress("a", i);
  Succeed();
  WatchCursor cursor = Open(0);
  std::vector<v1::JobEvent> all;
  int steps = 0;
  while (!cursor.done()) {
    auto step = cursor.Next();
    ASSERT_TRUE(step.ok()) << step.status();
    ASSERT_FALSE(step->events.empty() && !step->done) << "an ended job never asks its watcher to wait";
    for (v1::JobEvent& e : step->events) all.push_back(std::move(e));
    ASSERT_LT(++steps, 100);
  }
  EXPECT_GE(steps, 3);  // the snapshot, then a page at a time
  ASSERT_EQ(all.size(), 1u + 2 + kProgress + 2);  // snapshot, QUEUED, RUNNING, progress, summary, SUCCEEDED
  for (size_t i = 1; i < all.size(); ++i) EXPECT_EQ(all[i].seq(), static_cast<int64_t>(i)) << i;
  EXPECT_EQ(all.back().state(), v1::SUCCEEDED);
}

TEST_F(WatchCursorTest, AWatchFromTheEndOfAnEndedJobIsTheSnapshotAlone) {
  ASSERT_TRUE(jobs_->Start("a", "cpu").ok());
  Succeed();
  const int64_t last = jobs_->EventsAfter("a", 0, 0)->back().seq();
  WatchCursor cursor = Open(last);
  bool done = false;
  const std::vector<v1::JobEvent> events = Drain(cursor, &done);
  EXPECT_THAT(Describe(events), ElementsAre("snapshot@" + std::to_string(last)));
  EXPECT_EQ(events[0].snapshot().state(), v1::SUCCEEDED);
  EXPECT_TRUE(done);
}

// As an attacker: a seq far past anything stored. The watcher sees nothing after it, waits
// while the job runs, and is ended once the job ends (it is not left waiting forever).
TEST_F(WatchCursorTest, ASeqBeyondAnyEventEndsWhenTheJobEnds) {
  WatchCursor cursor = Open(int64_t{1} << 40);
  bool done = true;
  EXPECT_THAT(Describe(Drain(cursor, &done)), ElementsAre("snapshot@" + std::to_string(int64_t{1} << 40)));
  EXPECT_FALSE(done);
  ASSERT_TRUE(jobs_->Start("a", "cpu").ok());
  Progress("a", 1);
  EXPECT_THAT(Drain(cursor, &done), IsEmpty());
  EXPECT_FALSE(done);
  ASSERT_TRUE(jobs_->Cancel("a", "test").ok());
  ASSERT_TRUE(jobs_->Cancelled("a", "test").ok());
  EXPECT_THAT(Drain(cursor, &done), IsEmpty());
  EXPECT_TRUE(done);
}

TEST_F(WatchCursorTest, AJobMissingFromTheStoreEndsTheWatchWithTheStoresError) {
  v1::Job missing = *jobs_->Get("a");
  missing.set_id("never-stored");
  WatchCursor lost(reads_.get(), missing, 0);
  ASSERT_TRUE(lost.Next().ok());  // the snapshot it was given
  auto next = lost.Next();
  EXPECT_TRUE(absl::IsNotFound(next.status())) << next.status();
}

}  // namespace
}  // namespace recal::jobs
