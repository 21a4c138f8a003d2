// The job state machine over a real SQLite store: each transition, the ones it refuses, what
// a cancel does to each state, start-up recovery bounded by max_attempts, and that watchers
// are told only of what was stored.
#include "server/jobs/job_repository.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "tests/jobs/job_store_fixture.h"

namespace recal::jobs {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class JobRepositoryTest : public JobStoreTest {
 protected:
  v1::JobState StateOf(const std::string& id) { return jobs_->Get(id)->state(); }
  // "state:RUNNING", "progress:2", "summary", "failure:<message>" for each stored event.
  std::vector<std::string> Events(const std::string& id) {
    std::vector<std::string> out;
    const std::vector<v1::JobEvent> events = *jobs_->EventsAfter(id, 0, 0);
    for (const v1::JobEvent& e : events) {
      switch (e.kind_case()) {
        case v1::JobEvent::kState: out.push_back("state:" + v1::JobState_Name(e.state())); break;
        case v1::JobEvent::kProgress: out.push_back("progress:" + std::to_string(e.progress().batches_done())); break;
        case v1::JobEvent::kSummary: out.push_back("summary"); break;
        case v1::JobEvent::kFailure: out.push_back("failure:" + e.failure().message()); break;
        default: out.push_back("other");
      }
    }
    return out;
  }

};

TEST_F(JobRepositoryTest, APlanIsStoredWithTheJobAndEachOfItsShards) {
  v1::Job job;
  job.set_id("sharded");
  job.set_tenant("t");
  job.mutable_spec()->set_model_id("sha256:00");
  job.mutable_spec()->set_shards(2);
  worker::v1::JobPlan plan;
  plan.set_model_id("sha256:00");
  plan.set_batch_size(16);
  plan.mutable_data()->mutable_synthetic()->add_sample_shape(3);
  plan.mutable_engine()->set_compute_dtype(v1::BFLOAT16);
  bool created = false;
  ASSERT_TRUE(jobs_->Create(job, plan, &created).ok());
  for (const std::string& id : {std::string("sharded"), ShardJobId("sharded", 0), ShardJobId("sharded", 1)}) {
    absl::StatusOr<std::optional<worker::v1::JobPlan>> stored = jobs_->Plan(id);
    ASSERT_TRUE(stored.ok()) << stored.status();
    ASSERT_TRUE(stored->has_value()) << id;
    EXPECT_EQ((*stored)->SerializeAsString(), plan.SerializeAsString()) << id;
  }
  EXPECT_FALSE(jobs_->Plan(Create("unplanned").id())->has_value()) << "an empty plan reads as none";
  EXPECT_TRUE(absl::IsNotFound(jobs_->Plan("no-such-job").status()));
}

TEST_F(JobRepositoryTest, CreateQueuesTheJobOnceForARequestId) {
  const v1::Job first = Create("a", "request-1");
  EXPECT_EQ(first.state(), v1::QUEUED);
  EXPECT_TRUE(first.has_create_time());
  v1::Job again;
  again.set_id("b");
  again.set_request_id("request-1");
  again.set_tenant("t");
  bool created = true;
  auto stored = jobs_->Create(again, worker::v1::JobPlan(), &created);
  ASSERT_TRUE(stored.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(stored->id(), "a");
  EXPECT_TRUE(absl::IsNotFound(jobs_->Get("b").status()));
  EXPECT_THAT(Events("a"), ElementsAre("state:QUEUED"));
}

TEST_F(JobRepositoryTest, ARunStartsCountsItsAttemptAndSucceedsWithItsResultsInOneStep) {
  Create("a");
  auto running = jobs_->Start("a", "cpu");
  ASSERT_TRUE(running.ok()) << running.status();
  EXPECT_EQ(running->state(), v1::RUNNING);
  EXPECT_EQ(running->device(), "cpu");
  EXPECT_EQ(running->attempts(), 1);
  v1::JobProgress progress;
  progress.set_batches_done(2);
  ASSERT_TRUE(jobs_->Progress("a", progress).ok());
  EXPECT_EQ(jobs_->Get("a")->progress().batches_done(), 2);
  v1::RunReport report;
  report.set_batches(2);
  auto done = jobs_->Succeed("a", {{v1::MODEL, {"abcd", 4}}, {v1::REPORT, {"ef01", 2}}}, report);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED);
  EXPECT_TRUE(done->has_end_time());
  EXPECT_EQ(jobs_->Result("a", v1::MODEL)->sha256, "abcd");
  EXPECT_EQ(jobs_->Result("a", v1::REPORT)->size, 2);
  // The summary comes before the terminal state: a watcher that stops there has both.
  EXPECT_THAT(Events("a"), ElementsAre("state:QUEUED", "state:RUNNING", "progress:2", "summary", "state:SUCCEEDED"));
}

TEST_F(JobRepositoryTest, TransitionsOutsideTheMachineAreRefusedAndChangeNothing) {
  Create("a");
  EXPECT_TRUE(absl::IsFailedPrecondition(jobs_->Succeed("a", {}, v1::RunReport()).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(jobs_->Fail("a", absl::InternalError("x")).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(jobs_->Requeue("a").status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(jobs_->Progress("a", v1::JobProgress())));
  ASSERT_TRUE(jobs_->Start("a", "cpu").ok());
  auto again = jobs_->Start("a", "cuda:0");
  EXPECT_TRUE(absl::IsFailedPrecondition(again.status()));
  EXPECT_THAT(again.status().message(), HasSubstr("RUNNING"));
  ASSERT_TRUE(jobs_->Fail("a", absl::InternalError("the worker was killed by SIGKILL")).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(jobs_->Succeed("a", {{v1::MODEL, {"abcd", 4}}}, v1::RunReport()).status()));
  EXPECT_TRUE(absl::IsNotFound(jobs_->Result("a", v1::MODEL).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(jobs_->Progress("a", v1::JobProgress())));
  const v1::Job failed = *jobs_->Get("a");
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_EQ(failed.error().code(), static_cast<int>(absl::StatusCode::kInternal));
  EXPECT_THAT(Events("a"), ElementsAre("state:QUEUED", "state:RUNNING", "failure:the worker was killed by SIGKILL",
                                       "state:FAILED"));
  EXPECT_TRUE(absl::IsNotFound(jobs_->Start("nope", "cpu").status()));
}

TEST_F(JobRepositoryTest, ACancelEndsAQueuedJobAndTurnsEveryEndOfARunButSuccessIntoCancelled) {
  Create("queued");
  EXPECT_EQ(jobs_->Cancel("queued", "cancelled by request")->state(), v1::CANCELLED);
  EXPECT_THAT(jobs_->Get("queued")->error().message(), HasSubstr("while queued"));
  EXPECT_TRUE(absl::IsFailedPrecondition(jobs_->Start("queued", "cpu").status()));

  for (const std::string end : {"fail", "requeue", "cancelled"}) {
    Create(end);
    ASSERT_TRUE(jobs_->Start(end, "cpu").ok());
    EXPECT_EQ(jobs_->Cancel(end, "cancelled by request")->state(), v1::CANCELLING);
    EXPECT_EQ(jobs_->Cancel(end, "cancelled by request")->state(), v1::CANCELLING);  // once is enough
    absl::StatusOr<v1::Job> ended = end == "fail"      ? jobs_->Fail(end, absl::InternalError("killed"))
                                    : end == "requeue" ? jobs_->Requeue(end)
                                                       : jobs_->Cancelled(end, "cancelled by request");
    ASSERT_TRUE(ended.ok()) << end << ": " << ended.status();
    EXPECT_EQ(ended->state(), v1::CANCELLED) << end;
    EXPECT_EQ(ended->error().code(), static_cast<int>(absl::StatusCode::kCancelled)) << end;
  }

  // The last batch finished as the cancel came: the results are whole and are kept.
  Create("late");
  ASSERT_TRUE(jobs_->Start("late", "cpu").ok());
  ASSERT_TRUE(jobs_->Cancel("late", "cancelled by request").ok());
  EXPECT_EQ(jobs_->Succeed("late", {{v1::MODEL, {"abcd", 4}}}, v1::RunReport())->state(), v1::SUCCEEDED);
  // An ended job stays as it is.
  EXPECT_EQ(jobs_->Cancel("late", "cancelled by request")->state(), v1::SUCCEEDED);
}

TEST_F(JobRepositoryTest, RecoveryRequeuesInterruptedRunsUntilMaxAttemptsThenFailsThem) {
  Create("a");
  Create("b");
  ASSERT_TRUE(jobs_->Start("b", "cpu").ok());
  ASSERT_TRUE(jobs_->Cancel("b", "cancelled by request").ok());
  for (int attempt = 1; attempt <= 3; ++attempt) {
    ASSERT_TRUE(jobs_->Start("a", "cpu").ok());
    // The process dies here; the next one starts.
    auto recovered = jobs_->RecoverInterrupted(/*max_attempts=*/3);
    ASSERT_TRUE(recovered.ok()) << recovered.status();
    const v1::JobState expected = attempt < 3 ? v1::QUEUED : v1::FAILED;
    EXPECT_EQ(StateOf("a"), expected) << "after attempt " << attempt;
    EXPECT_EQ(jobs_->Get("a")->attempts(), attempt);
    if (expected == v1::FAILED) break;
  }
  EXPECT_THAT(jobs_->Get("a")->error().message(), HasSubstr("3 times (--max_attempts=3)"));
  EXPECT_EQ(StateOf("b"), v1::CANCELLED);
  EXPECT_TRUE(jobs_->RecoverInterrupted(3)->empty());  // nothing left running
}

TEST_F(JobRepositoryTest, AClientStreamJobWhoseLeaseExpiredFailsInsteadOfWaitingForPushesAgain) {
  v1::Job stream;
  stream.set_id("stream");
  stream.set_tenant("t");
  stream.mutable_spec()->set_model_id("sha256:00");
  stream.mutable_spec()->mutable_data()->mutable_client_stream();
  bool created = false;
  ASSERT_TRUE(jobs_->Create(stream, worker::v1::JobPlan(), &created).ok());
  Create("files");
  const int64_t now = absl::ToUnixMillis(absl::Now());
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(jobs_->Claim("cpu", "worker-1", now - 1000)->has_value());
  auto recovered = jobs_->RecoverExpired(now, /*max_attempts=*/3);
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(StateOf("files"), v1::QUEUED);  // its data can be read again
  const v1::Job failed = *jobs_->Get("stream");
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_EQ(failed.error().code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_THAT(failed.error().message(), HasSubstr("push from the first batch"));
  EXPECT_THAT(Events("stream"), ::testing::Contains(HasSubstr("failure:the worker running this client-stream job")));
  // At start-up of the embedded server (no other process: its clients push again) it is
  // queued again, as it always was.
  stream.set_id("stream-2");
  ASSERT_TRUE(jobs_->Create(stream, worker::v1::JobPlan(), &created).ok());
  ASSERT_TRUE(jobs_->Start("stream-2", "cpu").ok());
  ASSERT_TRUE(jobs_->RecoverInterrupted(3).ok());
  EXPECT_EQ(StateOf("stream-2"), v1::QUEUED);
}

TEST_F(JobRepositoryTest, WatchersAreToldOfStoredChangesOnly) {
  int64_t version = events_.version();
  Create("a");
  EXPECT_NE(events_.version(), version);
  version = events_.version();
  EXPECT_FALSE(jobs_->Succeed("a", {}, v1::RunReport()).ok());
  EXPECT_EQ(events_.version(), version);
  ASSERT_TRUE(jobs_->Start("a", "cpu").ok());
  EXPECT_NE(events_.version(), version);
}

}  // namespace
}  // namespace recal::jobs
