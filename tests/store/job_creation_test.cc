// CreateJob's rules on a scripted transaction: the order of the queries, and the outcomes of
// races that the conformance suite (metadata_store_test.cc, on both backends) cannot force:
// an insert that lost to a concurrent creator, a row number taken.
#include "server/store/job_creation.h"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/store/metadata_test_util.h"

namespace recal::store::internal {
namespace {

using ::recal::store::test::MakeJob;
using ::testing::ElementsAre;

// Answers as scripted and records each query, in order.
class ScriptedTransaction final : public JobCreationTransaction {
 public:
  std::vector<std::string> calls;
  // The stored job with the request_id: before any insert, and once an insert was refused (a
  // concurrent creator committed it meanwhile).
  std::optional<v1::Job> stored_before_insert, stored_after_refused_insert;
  TopLevelJobCounts counts;
  bool model = true;
  std::set<std::string> refused_ids;  // InsertJob returns false for these
  std::set<std::string> existing_ids;  // JobExists
  bool committed = false;

  absl::Status LockTenant(const std::string& tenant) override {
    calls.push_back("lock " + tenant);
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<v1::Job>> JobWithRequestId(const std::string& /*tenant*/,
                                                          const std::string& request_id) override {
    calls.push_back("request " + request_id);
    return insert_refused_ ? stored_after_refused_insert : stored_before_insert;
  }
  absl::StatusOr<TopLevelJobCounts> CountTopLevelJobs(const std::string& /*tenant*/, int64_t created_after_ms) override {
    calls.push_back(absl::StrCat("count after ", created_after_ms));
    return counts;
  }
  absl::StatusOr<bool> HoldModel(const std::string& /*tenant*/, const std::string& model_id) override {
    calls.push_back("model " + model_id);
    return model;
  }
  absl::StatusOr<bool> InsertJob(const v1::Job& job, const std::vector<v1::JobEvent>& events,
                                 int64_t created_ms) override {
    calls.push_back(absl::StrCat("insert ", job.id(), " with ", events.size(), " at ", created_ms));
    if (refused_ids.count(job.id()) > 0) {
      insert_refused_ = true;
      return false;
    }
    return true;
  }
  absl::StatusOr<bool> JobExists(const std::string& id) override {
    calls.push_back("exists " + id);
    return existing_ids.count(id) > 0;
  }
  absl::Status Commit() override {
    calls.push_back("commit");
    committed = true;
    return absl::OkStatus();
  }

 private:
  bool insert_refused_ = false;
};

JobQuota Checked(int64_t max_active_jobs, bool model_must_exist) {
  JobQuota quota;
  quota.max_active_jobs = max_active_jobs;
  quota.model_must_exist = model_must_exist;
  quota.now_ms = 100000;
  return quota;
}

TEST(JobCreation, LocksThenLooksUpTheRequestThenCountsThenHoldsTheModelThenStoresTheJobAndItsShards) {
  const v1::Job job = MakeJob("p", v1::QUEUED, "key");
  const std::vector<v1::JobEvent> events(1);
  std::vector<NewJob> children(2);
  for (int i = 0; i < 2; ++i) {
    children[i].job = MakeJob(absl::StrCat("p-", i), v1::QUEUED);
    children[i].job.set_parent_id("p");
  }
  const JobQuota quota = Checked(5, true);
  absl::StatusOr<JobCreation> creation = JobCreation::Check(job, events, children, quota);
  ASSERT_TRUE(creation.ok()) << creation.status();
  ScriptedTransaction txn;
  bool created = false;
  absl::StatusOr<v1::Job> stored = creation->StoreIn(txn, &created);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(created);
  EXPECT_EQ(stored->id(), "p");
  // The minute counted ends at the creation time, which every row is stored with.
  EXPECT_THAT(txn.calls, ElementsAre("lock t", "request key", "count after 40000", "model sha256:m",
                                     "insert p with 1 at 100000", "insert p-0 with 0 at 100000",
                                     "insert p-1 with 0 at 100000", "commit"));
}

TEST(JobCreation, WithoutAQuotaNeitherLocksNorCountsAndWithoutARequestIdLooksNothingUp) {
  const v1::Job job = MakeJob("j", v1::QUEUED);
  const std::vector<v1::JobEvent> events;
  const std::vector<NewJob> children;
  const JobQuota quota = Checked(0, false);
  ScriptedTransaction txn;
  ASSERT_TRUE(JobCreation::Check(job, events, children, quota)->StoreIn(txn, nullptr).ok());
  EXPECT_THAT(txn.calls, ElementsAre("insert j with 0 at 100000", "commit"));
}

TEST(JobCreation, AStoredRequestIsTheAnswerBeforeAnyQuotaOrModelIsChecked) {
  const v1::Job job = MakeJob("again", v1::QUEUED, "key");
  const std::vector<v1::JobEvent> events;
  const std::vector<NewJob> children;
  const JobQuota quota = Checked(1, true);
  ScriptedTransaction txn;
  txn.stored_before_insert = MakeJob("first", v1::SUCCEEDED, "key");
  txn.counts.active = 7;
  txn.model = false;
  bool created = true;
  absl::StatusOr<v1::Job> answer = JobCreation::Check(job, events, children, quota)->StoreIn(txn, &created);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_FALSE(created);
  EXPECT_EQ(answer->id(), "first");
  EXPECT_THAT(txn.calls, ElementsAre("lock t", "request key"));
  EXPECT_FALSE(txn.committed);
}

TEST(JobCreation, AnInsertLostToAConcurrentCreatorOfTheSameRequestIsAnsweredWithItsJob) {
  const v1::Job job = MakeJob("mine", v1::QUEUED, "key");
  const std::vector<v1::JobEvent> events;
  const std::vector<NewJob> children;
  const JobQuota quota = Checked(0, false);
  ScriptedTransaction txn;
  txn.refused_ids = {"mine"};
  txn.stored_after_refused_insert = MakeJob("theirs", v1::QUEUED, "key");
  bool created = true;
  absl::StatusOr<v1::Job> answer = JobCreation::Check(job, events, children, quota)->StoreIn(txn, &created);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_FALSE(created);
  EXPECT_EQ(answer->id(), "theirs");
  EXPECT_THAT(txn.calls, ElementsAre("request key", "insert mine with 0 at 100000", "request key"));
  EXPECT_FALSE(txn.committed);
}

TEST(JobCreation, ATakenIdIsAlreadyExistsAndATakenRowNumberIsInternal) {
  const std::vector<v1::JobEvent> events;
  const JobQuota quota = Checked(0, false);
  {
    const v1::Job job = MakeJob("taken", v1::QUEUED, "key");
    const std::vector<NewJob> children;
    ScriptedTransaction txn;
    txn.refused_ids = {"taken"};
    txn.existing_ids = {"taken"};
    EXPECT_TRUE(absl::IsAlreadyExists(JobCreation::Check(job, events, children, quota)->StoreIn(txn, nullptr).status()));
    EXPECT_FALSE(txn.committed);
  }
  {
    // A shard's id: all or nothing, nothing committed.
    const v1::Job job = MakeJob("p", v1::QUEUED);
    std::vector<NewJob> children(1);
    children[0].job = MakeJob("p-0", v1::QUEUED);
    children[0].job.set_parent_id("p");
    ScriptedTransaction txn;
    txn.refused_ids = {"p-0"};
    txn.existing_ids = {"p-0"};
    EXPECT_TRUE(absl::IsAlreadyExists(JobCreation::Check(job, events, children, quota)->StoreIn(txn, nullptr).status()));
    EXPECT_FALSE(txn.committed);
  }
  {
    const v1::Job job = MakeJob("fresh", v1::QUEUED);
    const std::vector<NewJob> children;
    ScriptedTransaction txn;
    txn.refused_ids = {"fresh"};
    absl::Status refused = JobCreation::Check(job, events, children, quota)->StoreIn(txn, nullptr).status();
    EXPECT_TRUE(absl::IsInternal(refused)) << refused;
    EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("create_seq"));
  }
}

TEST(JobCreation, ChecksWhatItStoresBeforeAnyTransaction) {
  const std::vector<v1::JobEvent> events;
  const JobQuota quota;
  const std::vector<NewJob> none;
  EXPECT_TRUE(absl::IsInvalidArgument(JobCreation::Check(MakeJob("", v1::QUEUED), events, none, quota).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(JobCreation::Check(MakeJob("j", v1::QUEUED, "", "m", ""), events, none, quota).status()));
  std::vector<NewJob> stray(1);
  stray[0].job = MakeJob("j-0", v1::QUEUED);
  stray[0].job.set_parent_id("other");
  EXPECT_TRUE(absl::IsInvalidArgument(JobCreation::Check(MakeJob("j", v1::QUEUED), events, stray, quota).status()));
}

}  // namespace
}  // namespace recal::store::internal
