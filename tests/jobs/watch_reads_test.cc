// The watchers of a job share their store reads (WatchReads), over a real SQLite store: one
// read per change however many watch, every watcher still sees every event once, a change
// is read once the hub announces it, and only a bounded number of jobs is kept.
#include "server/jobs/watch_reads.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/jobs/watch_cursor.h"
#include "tests/jobs/job_store_fixture.h"

namespace recal::jobs {
namespace {

using ::testing::SizeIs;

class WatchReadsTest : public JobStoreTest {
 protected:
  void SetUp() override {
    JobStoreTest::SetUp();
    reads_ = std::make_unique<WatchReads>(jobs_.get(), &events_, /*max_jobs=*/2);
    for (const char* id : {"a", "b", "c"}) CreateRunning(id);
  }
  // The seqs of the events after `after_seq`, as the watchers' reads give them.
  std::vector<int64_t> SeqsAfter(const std::string& id, int64_t after_seq) {
    return Seqs(reads_->EventsAfter(id, after_seq, 256));
  }
  static std::vector<int64_t> Seqs(const absl::StatusOr<std::vector<v1::JobEvent>>& events) {
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<int64_t> seqs;
    for (const v1::JobEvent& event : events.value_or(std::vector<v1::JobEvent>())) seqs.push_back(event.seq());
    return seqs;
  }
  // The same from the store itself.
  std::vector<int64_t> StoredSeqsAfter(const std::string& id, int64_t after_seq) {
    return Seqs(jobs_->EventsAfter(id, after_seq, 256));
  }

  std::unique_ptr<WatchReads> reads_;
};

// 200 watchers of one job through 10 progress events: without sharing, 200 reads per event.
TEST_F(WatchReadsTest, TheWatchersOfAJobShareOneStoreReadPerChange) {
  std::vector<std::unique_ptr<WatchCursor>> watchers;
  std::vector<int> progress_seen(200, 0);
  for (int i = 0; i < 200; ++i) watchers.push_back(std::make_unique<WatchCursor>(reads_.get(), *jobs_->Get("a"), 0));
  auto drain_all = [&] {
    for (size_t i = 0; i < watchers.size(); ++i) {
      while (true) {
        absl::StatusOr<WatchCursor::Step> step = watchers[i]->Next();
        ASSERT_TRUE(step.ok()) << step.status();
        for (const v1::JobEvent& event : step->events) progress_seen[i] += event.has_progress() ? 1 : 0;
        if (step->events.empty() || step->done) break;
      }
    }
  };
  drain_all();
  const int64_t before = reads_->store_reads();
  EXPECT_LE(before, 4) << "the first watcher read the events and the job; the others shared them";
  for (int batch = 1; batch <= 10; ++batch) {
    Progress("a", batch);
    drain_all();
  }
  EXPECT_LE(reads_->store_reads() - before, 2 * 10);
  for (int seen : progress_seen) EXPECT_EQ(seen, 10);
}

// The hub says when to read again: a change it was not told of (another process's, before
// its notification arrives) is read once it is, which is what the watchers' recheck relies on.
TEST_F(WatchReadsTest, AChangeIsReadFromTheStoreOnceTheHubAnnouncesIt) {
  const std::vector<int64_t> first = SeqsAfter("a", 0);
  ASSERT_FALSE(first.empty());
  v1::JobEvent unannounced;
  unannounced.mutable_progress()->set_batches_done(7);
  ASSERT_TRUE(metadata_->AppendEvent("a", unannounced).ok());
  EXPECT_EQ(SeqsAfter("a", 0), first) << "kept until the hub says the job changed";
  events_.PublishAll();
  EXPECT_EQ(SeqsAfter("a", 0), StoredSeqsAfter("a", 0));
  EXPECT_THAT(SeqsAfter("a", 0), SizeIs(first.size() + 1));
}

TEST_F(WatchReadsTest, AWatcherFurtherBackGetsEveryEventItMissed) {
  Progress("a", 1);
  Progress("a", 2);
  const std::vector<int64_t> all = StoredSeqsAfter("a", 0);
  ASSERT_GE(all.size(), 3u);
  EXPECT_EQ(SeqsAfter("a", all[1]), std::vector<int64_t>(all.begin() + 2, all.end())) << "a watcher near the end";
  EXPECT_EQ(SeqsAfter("a", 0), all) << "one from the start";
  EXPECT_EQ(SeqsAfter("a", all[0]), std::vector<int64_t>(all.begin() + 1, all.end())) << "from what was kept";
  EXPECT_TRUE(SeqsAfter("a", all.back() + 5).empty()) << "past the end";
  auto limited = reads_->EventsAfter("a", 0, 2);
  ASSERT_TRUE(limited.ok());
  EXPECT_THAT(*limited, SizeIs(2)) << "at most the limit";
}

TEST_F(WatchReadsTest, TheJobIsReadAgainOnceItChanged) {
  ASSERT_TRUE(reads_->Get("a").ok());
  const int64_t reads = reads_->store_reads();
  EXPECT_EQ(reads_->Get("a")->progress().batches_done(), 0);
  EXPECT_EQ(reads_->store_reads(), reads) << "unchanged: shared";
  Progress("a", 3);
  EXPECT_EQ(reads_->Get("a")->progress().batches_done(), 3);
  EXPECT_EQ(reads_->store_reads(), reads + 1);
  EXPECT_TRUE(absl::IsNotFound(reads_->Get("no-such-job").status()));
}

TEST_F(WatchReadsTest, OnlyTheMostRecentlyWatchedJobsAreKept) {
  for (const char* id : {"a", "b"}) SeqsAfter(id, 0);
  const int64_t reads = reads_->store_reads();
  SeqsAfter("a", 0);
  SeqsAfter("b", 0);
  EXPECT_EQ(reads_->store_reads(), reads) << "both kept (max_jobs 2)";
  EXPECT_EQ(SeqsAfter("c", 0), StoredSeqsAfter("c", 0));  // drops a, the least recent
  SeqsAfter("b", 0);
  EXPECT_EQ(reads_->store_reads(), reads + 1);
  EXPECT_EQ(SeqsAfter("a", 0), StoredSeqsAfter("a", 0));
  EXPECT_EQ(reads_->store_reads(), reads + 2) << "a was read again";
}

}  // namespace
}  // namespace recal::jobs
