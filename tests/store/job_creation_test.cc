// CreateJob's rules on scripted queries: the order of the queries, and the outcomes of
// races that the conformance suite (metadata_store_test.cc, on both backends) cannot force:
// an insert that lost to a concurrent creator, a row number taken.
#include "server/store/job_creation.h"

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/store/metadata_test_util.h"

namespace recal::store::internal {
namespace {

using ::recal::store::test::MakeJob;
using ::testing::ElementsAre;

// Answers as scripted and records each query, in order.
class ScriptedQueries final : public JobCreationQueries {
 public:
  std::vector<std::string> calls;
  // The stored job with the request_id: before any insert, and once an insert was refused (a
  // concurrent creator committed it meanwhile).
  std::optional<v1::Job> stored_before_insert, stored_after_refused_insert;
  TopLevelJobCounts counts;
  bool model = true;
  std::set<std::string> refused_ids;  // InsertJob returns false for these
  std::set<std::string> existing_ids;  // JobExists

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
  absl::StatusOr<bool> InsertNewJob(const v1::Job& job, const std::vector<v1::JobEvent>& events,
                                    const std::string& plan, int64_t created_ms) override {
    std::string call = absl::StrCat("insert ", job.id(), " with ", events.size(), " at ", created_ms);
    if (!plan.empty()) absl::StrAppend(&call, " plan ", plan);
    calls.push_back(std::move(call));
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

// `n` shards of `parent`, without events.
std::vector<NewJob> Shards(const std::string& parent, int n) {
  std::vector<NewJob> children(n);
  for (int i = 0; i < n; ++i) {
    children[i].job = MakeJob(absl::StrCat(parent, "-", i), v1::QUEUED);
    children[i].job.set_parent_id(parent);
  }
  return children;
}

TEST(JobCreation, LocksThenLooksUpTheRequestThenCountsThenHoldsTheModelThenStoresTheJobAndItsShards) {
  const v1::Job job = MakeJob("p", v1::QUEUED, "key");
  const std::vector<v1::JobEvent> events(1);
  std::vector<NewJob> children = Shards("p", 2);
  children[0].plan = "first";
  children[1].plan = "second";
  const JobQuota quota = Checked(5, true);
  const std::string plan = "whole";
  absl::StatusOr<JobCreation> creation = JobCreation::Check(job, events, children, quota, plan);
  ASSERT_TRUE(creation.ok()) << creation.status();
  ScriptedQueries queries;
  absl::StatusOr<JobCreation::Outcome> stored = creation->StoreIn(queries);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(stored->created);
  EXPECT_EQ(stored->job.id(), "p");
  // The minute counted ends at the creation time, which every row is stored with; each row
  // with its own plan.
  EXPECT_THAT(queries.calls, ElementsAre("lock t", "request key", "count after 40000", "model sha256:m",
                                         "insert p with 1 at 100000 plan whole",
                                         "insert p-0 with 0 at 100000 plan first",
                                         "insert p-1 with 0 at 100000 plan second"));
}

// Stores `job`, without events or shards, by `queries`.
absl::StatusOr<JobCreation::Outcome> StoreAlone(const v1::Job& job, const JobQuota& quota, ScriptedQueries& queries) {
  const std::vector<v1::JobEvent> events;
  const std::vector<NewJob> children;
  const std::string plan;
  RECAL_ASSIGN_OR_RETURN(const JobCreation creation, JobCreation::Check(job, events, children, quota, plan));
  return creation.StoreIn(queries);
}

TEST(JobCreation, WithoutAQuotaNeitherLocksNorCountsAndWithoutARequestIdLooksNothingUp) {
  ScriptedQueries queries;
  absl::StatusOr<JobCreation::Outcome> stored = StoreAlone(MakeJob("j", v1::QUEUED), Checked(0, false), queries);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(stored->created);
  EXPECT_THAT(queries.calls, ElementsAre("insert j with 0 at 100000"));
}

TEST(JobCreation, AStoredRequestIsTheAnswerBeforeAnyQuotaOrModelIsChecked) {
  ScriptedQueries queries;
  queries.stored_before_insert = MakeJob("first", v1::SUCCEEDED, "key");
  queries.counts.active = 7;
  queries.model = false;
  absl::StatusOr<JobCreation::Outcome> answer =
      StoreAlone(MakeJob("again", v1::QUEUED, "key"), Checked(1, true), queries);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_FALSE(answer->created);
  EXPECT_EQ(answer->job.id(), "first");
  EXPECT_THAT(queries.calls, ElementsAre("lock t", "request key"));
}

TEST(JobCreation, AnInsertLostToAConcurrentCreatorOfTheSameRequestIsAnsweredWithItsJob) {
  ScriptedQueries queries;
  queries.refused_ids = {"mine"};
  queries.stored_after_refused_insert = MakeJob("theirs", v1::QUEUED, "key");
  absl::StatusOr<JobCreation::Outcome> answer =
      StoreAlone(MakeJob("mine", v1::QUEUED, "key"), Checked(0, false), queries);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_FALSE(answer->created);
  EXPECT_EQ(answer->job.id(), "theirs");
  EXPECT_THAT(queries.calls, ElementsAre("request key", "insert mine with 0 at 100000", "request key"));
}

// What storing `job` with `children` answers when inserts of the ids in `refused` do nothing
// and the ids in `existing` are another job's.
absl::Status RefusedInsert(const v1::Job& job, const std::vector<NewJob>& children, std::set<std::string> refused,
                           std::set<std::string> existing) {
  const std::vector<v1::JobEvent> events;
  const JobQuota quota = Checked(0, false);
  const std::string plan;
  ScriptedQueries queries;
  queries.refused_ids = std::move(refused);
  queries.existing_ids = std::move(existing);
  return JobCreation::Check(job, events, children, quota, plan)->StoreIn(queries).status();
}

TEST(JobCreation, ATakenIdIsAlreadyExistsAndATakenRowNumberIsInternal) {
  EXPECT_TRUE(absl::IsAlreadyExists(RefusedInsert(MakeJob("taken", v1::QUEUED, "key"), {}, {"taken"}, {"taken"})));
  // A shard's id: all or nothing (an error: the caller's transaction rolls back).
  EXPECT_TRUE(absl::IsAlreadyExists(RefusedInsert(MakeJob("p", v1::QUEUED), Shards("p", 2), {"p-1"}, {"p-1"})));
  const absl::Status refused = RefusedInsert(MakeJob("fresh", v1::QUEUED), {}, {"fresh"}, {});
  EXPECT_TRUE(absl::IsInternal(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("create_seq"));
}

TEST(JobCreation, ChecksWhatItStoresBeforeAnyTransaction) {
  const std::vector<v1::JobEvent> events;
  const JobQuota quota;
  const std::vector<NewJob> none;
  const std::string plan;
  EXPECT_TRUE(
      absl::IsInvalidArgument(JobCreation::Check(MakeJob("", v1::QUEUED), events, none, quota, plan).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      JobCreation::Check(MakeJob("j", v1::QUEUED, "", "m", ""), events, none, quota, plan).status()));
  const std::vector<NewJob> stray = Shards("other", 1);
  EXPECT_TRUE(
      absl::IsInvalidArgument(JobCreation::Check(MakeJob("j", v1::QUEUED), events, stray, quota, plan).status()));
}

}  // namespace
}  // namespace recal::store::internal
