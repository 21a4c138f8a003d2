// The MetadataStore conformance suite: what every backend must do alike, on SQLite and on
// PostgreSQL (a throwaway server per test binary; tests skip, saying why, without one).
#include "server/store/metadata_store.h"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/store/metadata_test_util.h"
#include "tests/store/postgres_server.h"
#include "tests/test_util.h"

namespace recal::store {
namespace {

using ::recal::store::test::DigestId;
using ::recal::store::test::Ids;
using ::recal::store::test::MakeJob;
using ::recal::store::test::MakeModel;
using ::recal::store::test::OpenDb;
using ::recal::store::test::StateEvent;
using ::recal::testing::PostgresServer;
using ::recal::testing::TempDir;

// The conformance suite: every TEST_P runs on both backends, each test on a fresh database
// (a new SQLite file, or a new database on the binary's PostgreSQL server).
class MetadataStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "postgresql") {
      absl::StatusOr<PostgresServer*> server = PostgresServer::Shared();
      if (absl::IsNotFound(server.status())) GTEST_SKIP() << server.status().message();
      ASSERT_TRUE(server.ok()) << server.status();
      server_ = *server;
    }
    absl::StatusOr<std::string> spec = FreshSpec();
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
    db_ = OpenDb(spec_);
    ASSERT_NE(db_, nullptr);
  }

  // A database no store has opened yet.
  absl::StatusOr<std::string> FreshSpec() {
    if (server_ != nullptr) return server_->NewDatabase();
    return absl::StrCat("sqlite:", dir_.File(absl::StrCat("meta", ++files_, ".db")));
  }

  TempDir dir_;
  PostgresServer* server_ = nullptr;
  int files_ = 0;
  std::string spec_;
  std::unique_ptr<MetadataStore> db_;
};

TEST_P(MetadataStoreTest, TenantsKeepTheirOwnModelsJobsAndRequestIds) {
  ASSERT_TRUE(db_->PutModel(MakeModel("sha256:a", "mine", "t")).ok());
  ASSERT_TRUE(db_->PutModel(MakeModel("sha256:a", "theirs", "u")).ok());
  EXPECT_EQ(db_->GetModel("t", "sha256:a")->name(), "mine");
  EXPECT_EQ(db_->GetModel("u", "sha256:a")->name(), "theirs");
  EXPECT_TRUE(absl::IsNotFound(db_->GetModel("v", "sha256:a").status()));
  EXPECT_EQ(db_->ListModels("t", 0, "", "")->models.size(), 1u);
  EXPECT_EQ(db_->ListModels("", 0, "", "")->models.size(), 2u);
  ASSERT_TRUE(db_->DeleteModel("t", "sha256:a").ok());
  EXPECT_TRUE(*db_->ModelStoredByAnyTenant("sha256:a"));
  ASSERT_TRUE(db_->DeleteModel("u", "sha256:a").ok());
  EXPECT_FALSE(*db_->ModelStoredByAnyTenant("sha256:a"));

  // The same request_id in two tenants is two jobs: one tenant's key never finds another's job.
  bool created = false;
  ASSERT_TRUE(db_->CreateJob(MakeJob("j1", v1::QUEUED, "key", "sha256:m", "t"), &created).ok());
  EXPECT_TRUE(created);
  auto other = db_->CreateJob(MakeJob("j2", v1::QUEUED, "key", "sha256:m", "u"), &created);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(created);
  EXPECT_EQ(other->id(), "j2");
  EXPECT_EQ(db_->CreateJob(MakeJob("j3", v1::QUEUED, "key", "sha256:m", "u"), &created)->id(), "j2");
  EXPECT_FALSE(created);
  EXPECT_EQ(db_->FindJobByRequestId("t", "key")->id(), "j1");
  EXPECT_TRUE(absl::IsNotFound(db_->FindJobByRequestId("v", "key").status()));
  EXPECT_EQ(Ids(db_->ListJobs("u", {}, 0, "")->jobs), std::vector<std::string>{"j2"});
  EXPECT_EQ(db_->ListJobs("", {}, 0, "")->jobs.size(), 2u);
  EXPECT_TRUE(absl::IsInvalidArgument(db_->CreateJob(MakeJob("j4", v1::QUEUED, "", "sha256:m", ""), &created).status()));
}

TEST_P(MetadataStoreTest, UsageCountsActiveJobsAndStoredBytesPerTenant) {
  ASSERT_TRUE(db_->PutModel(MakeModel("sha256:a", "", "t")).ok());  // 42 bytes
  bool created = false;
  ASSERT_TRUE(db_->CreateJob(MakeJob("q", v1::QUEUED), &created).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("r", v1::RUNNING), &created).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("s", v1::SUCCEEDED), &created).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("o", v1::QUEUED, "", "sha256:m", "u"), &created).ok());
  ASSERT_TRUE(db_->PutResult("s", v1::MODEL, ResultRef{"ab", 100}).ok());
  ASSERT_TRUE(db_->PutResult("o", v1::MODEL, ResultRef{"cd", 1000}).ok());
  const TenantUsage usage = *db_->Usage("t");
  EXPECT_EQ(usage.active_jobs, 2);
  EXPECT_EQ(usage.stored_bytes, 142);
  EXPECT_EQ(db_->Usage("nobody")->stored_bytes, 0);
}

TEST_P(MetadataStoreTest, ModelPutTwiceIsOneModel) {
  ASSERT_EQ(db_->PutModel(MakeModel("sha256:a", "first"))->name(), "first");
  // The same id again keeps what is stored.
  EXPECT_EQ(db_->PutModel(MakeModel("sha256:a", "second"))->name(), "first");
  EXPECT_EQ(db_->GetModel("t", "sha256:a")->name(), "first");
  EXPECT_EQ(db_->ListModels("", 0, "", "")->models.size(), 1u);
  EXPECT_TRUE(absl::IsNotFound(db_->GetModel("t", "sha256:b").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(db_->PutModel(v1::Model()).status()));
}

TEST_P(MetadataStoreTest, ModelPaginationAndDelete) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(db_->PutModel(MakeModel(absl::StrCat("m", i), "")).ok());
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    absl::StatusOr<ModelPage> page = db_->ListModels("", 2, token, "");
    ASSERT_TRUE(page.ok()) << page.status();
    for (const auto& m : page->models) seen.push_back(m.id());
    token = page->next_page_token;
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, (std::vector<std::string>{"m4", "m3", "m2", "m1", "m0"}));  // newest first

  ASSERT_TRUE(db_->DeleteModel("t", "m2").ok());
  EXPECT_TRUE(absl::IsNotFound(db_->GetModel("t", "m2").status()));
  EXPECT_TRUE(absl::IsNotFound(db_->DeleteModel("t", "m2")));
  EXPECT_EQ(db_->ListModels("", 100, "", "")->models.size(), 4u);
}

TEST_P(MetadataStoreTest, NewBytesUnderANameAreItsNextVersionAndNumbersAreNeverReused) {
  EXPECT_EQ(db_->PutModel(MakeModel(DigestId("a"), "rn50"))->version(), 1);
  EXPECT_EQ(db_->PutModel(MakeModel(DigestId("b"), "rn50"))->version(), 2);
  // The same bytes again, under any name, are the stored model: its first name and version.
  EXPECT_EQ(db_->PutModel(MakeModel(DigestId("a"), "rn50"))->version(), 1);
  absl::StatusOr<v1::Model> renamed = db_->PutModel(MakeModel(DigestId("a"), "other"));
  ASSERT_TRUE(renamed.ok()) << renamed.status();
  EXPECT_EQ(absl::StrCat(renamed->name(), ":", renamed->version()), "rn50:1");
  EXPECT_TRUE(absl::IsNotFound(db_->GetModelVersion("t", "other", 0).status()));
  // Names are per tenant; no name is kDefaultModelName.
  EXPECT_EQ(db_->PutModel(MakeModel(DigestId("c"), "rn50", "u"))->version(), 1);
  absl::StatusOr<v1::Model> unnamed = db_->PutModel(MakeModel(DigestId("d"), ""));
  ASSERT_TRUE(unnamed.ok()) << unnamed.status();
  EXPECT_EQ(absl::StrCat(unnamed->name(), ":", unnamed->version()), absl::StrCat(kDefaultModelName, ":1"));

  // The latest version deleted: the name is the one before, and the next bytes get 3, never
  // 2 again (a job or a note that says "rn50:2" keeps meaning the bytes it meant).
  ASSERT_TRUE(db_->DeleteModel("t", DigestId("b")).ok());
  EXPECT_EQ(db_->GetModelVersion("t", "rn50", 0)->id(), DigestId("a"));
  EXPECT_EQ(db_->PutModel(MakeModel(DigestId("e"), "rn50"))->version(), 3);
  EXPECT_EQ(db_->GetModelVersion("t", "rn50", 0)->id(), DigestId("e"));
  EXPECT_EQ(db_->GetModelVersion("t", "rn50", 1)->id(), DigestId("a"));
  EXPECT_EQ(db_->GetModel("t", DigestId("e"))->version(), 3);
  EXPECT_TRUE(absl::IsNotFound(db_->GetModelVersion("t", "rn50", 2).status()));
  EXPECT_TRUE(absl::IsNotFound(db_->GetModelVersion("u", "rn50", 3).status()));
  EXPECT_TRUE(absl::IsNotFound(db_->GetModelVersion("v", "rn50", 0).status()));
  // Survives reopening: the numbers are stored, not counted.
  db_ = OpenDb(spec_);
  ASSERT_NE(db_, nullptr);
  EXPECT_EQ(db_->PutModel(MakeModel(DigestId("f"), "rn50"))->version(), 4);
}

TEST_P(MetadataStoreTest, DigestPrefixesFindTheTenantsOwnModelsOnly) {
  for (const char* hex : {"abc123", "abc124", "abd"}) ASSERT_TRUE(db_->PutModel(MakeModel(DigestId(hex), "n")).ok());
  ASSERT_TRUE(db_->PutModel(MakeModel(DigestId("abc125"), "n", "u")).ok());
  const auto found = [&](const std::string& tenant, const std::string& prefix, int limit) {
    absl::StatusOr<std::vector<v1::Model>> models = db_->FindModelsByDigestPrefix(tenant, prefix, limit);
    EXPECT_TRUE(models.ok()) << models.status();
    std::vector<std::string> ids;
    if (models.ok()) for (const v1::Model& m : *models) ids.push_back(m.id());
    return ids;
  };
  EXPECT_EQ(found("t", "abc12", 10), (std::vector<std::string>{DigestId("abc123"), DigestId("abc124")}));
  EXPECT_EQ(found("t", "abc123", 10), std::vector<std::string>{DigestId("abc123")});
  EXPECT_EQ(found("t", DigestId("abd").substr(7), 10), std::vector<std::string>{DigestId("abd")});
  EXPECT_EQ(found("t", "ab", 2).size(), 2u);  // the limit
  EXPECT_TRUE(found("t", "abc125", 10).empty());  // tenant u's
  EXPECT_EQ(found("u", "abc", 10), std::vector<std::string>{DigestId("abc125")});
}

TEST_P(MetadataStoreTest, ListModelsOfOneNameShowsItsVersionsNewestFirstInPages) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(db_->PutModel(MakeModel(DigestId(absl::StrCat("a", i)), "n")).ok());
    ASSERT_TRUE(db_->PutModel(MakeModel(DigestId(absl::StrCat("b", i)), "m")).ok());
  }
  ASSERT_TRUE(db_->PutModel(MakeModel(DigestId("c"), "n", "u")).ok());
  absl::StatusOr<ModelPage> first = db_->ListModels("t", 2, "", "n");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->models.size(), 2u);
  EXPECT_EQ(first->models[0].version(), 3);
  EXPECT_EQ(first->models[1].version(), 2);
  absl::StatusOr<ModelPage> second = db_->ListModels("t", 2, first->next_page_token, "n");
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->models.size(), 1u);
  EXPECT_EQ(second->models[0].id(), DigestId("a0"));
  EXPECT_TRUE(second->next_page_token.empty());
  EXPECT_EQ(db_->ListModels("", 0, "", "n")->models.size(), 4u);  // every tenant's "n"
  EXPECT_TRUE(db_->ListModels("t", 0, "", "nope")->models.empty());
}

// Uploads of different bytes under one name, at once from two processes: each its own
// version, none skipped.
TEST_P(MetadataStoreTest, ConcurrentUploadsUnderOneNameOnTwoStoresGetDistinctDenseVersions) {
  std::unique_ptr<MetadataStore> other = OpenDb(spec_);
  ASSERT_NE(other, nullptr);
  constexpr int kThreads = 4, kEach = 5;
  std::mutex mu;
  std::set<int64_t> versions;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      MetadataStore& store = t % 2 == 0 ? *db_ : *other;
      for (int i = 0; i < kEach; ++i) {
        absl::StatusOr<v1::Model> model = store.PutModel(MakeModel(DigestId(absl::StrCat(t, "f", i)), "n"));
        ASSERT_TRUE(model.ok()) << model.status();
        std::lock_guard<std::mutex> lock(mu);
        EXPECT_TRUE(versions.insert(model->version()).second) << model->version();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_EQ(versions.size(), static_cast<size_t>(kThreads * kEach));
  EXPECT_EQ(*versions.begin(), 1);
  EXPECT_EQ(*versions.rbegin(), kThreads * kEach);
}

TEST_P(MetadataStoreTest, GarbagePageTokensAreInvalidArgument) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(db_->PutModel(MakeModel(absl::StrCat("m", i), "")).ok());
    ASSERT_TRUE(db_->CreateJob(MakeJob(absl::StrCat("j", i), v1::QUEUED), nullptr).ok());
  }
  const std::string jobs_token = db_->ListJobs("", {}, 1, "")->next_page_token;
  const std::string models_token = db_->ListModels("", 1, "", "")->next_page_token;
  ASSERT_FALSE(jobs_token.empty());
  for (const std::string& bad : {std::string("garbage"), std::string("!!"), std::string("0"), models_token}) {
    EXPECT_TRUE(absl::IsInvalidArgument(db_->ListJobs("", {}, 1, bad).status())) << bad;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(db_->ListModels("", 1, jobs_token, "").status()));
}

TEST_P(MetadataStoreTest, CreateJobIsIdempotentOnRequestId) {
  bool created = false;
  ASSERT_TRUE(db_->CreateJob(MakeJob("j1", v1::QUEUED, "req-1"), &created).ok());
  EXPECT_TRUE(created);
  absl::StatusOr<v1::Job> again = db_->CreateJob(MakeJob("j2", v1::QUEUED, "req-1"), &created);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(created);
  EXPECT_EQ(again->id(), "j1");
  EXPECT_TRUE(absl::IsNotFound(db_->GetJob("j2").status()));

  // Jobs without a request_id never collide with each other.
  ASSERT_TRUE(db_->CreateJob(MakeJob("j3", v1::QUEUED), &created).ok());
  EXPECT_TRUE(created);
  ASSERT_TRUE(db_->CreateJob(MakeJob("j4", v1::QUEUED), &created).ok());
  EXPECT_TRUE(created);
  // A reused job id is a caller bug, reported as such.
  EXPECT_TRUE(absl::IsAlreadyExists(db_->CreateJob(MakeJob("j4", v1::QUEUED), &created).status()));
  EXPECT_EQ(db_->JobsInStates({})->size(), 3u);
}

TEST_P(MetadataStoreTest, UpdateJobAppendsEventsWithIncreasingSeq) {
  v1::Job job = MakeJob("j", v1::QUEUED);
  ASSERT_TRUE(db_->CreateJob(job, nullptr).ok());
  ASSERT_EQ(db_->EventsAfter("j", 0, 0)->size(), 0u);

  job.set_state(v1::RUNNING);
  absl::StatusOr<v1::JobEvent> e1 = db_->UpdateJob(job, StateEvent(v1::RUNNING));
  ASSERT_TRUE(e1.ok()) << e1.status();
  EXPECT_EQ(e1->seq(), 1);
  EXPECT_GT(e1->time().seconds(), 1600000000);
  v1::JobEvent progress;
  progress.mutable_progress()->set_batches_done(3);
  EXPECT_EQ(db_->AppendEvent("j", progress)->seq(), 2);
  job.set_state(v1::SUCCEEDED);
  EXPECT_EQ(db_->UpdateJob(job, StateEvent(v1::SUCCEEDED))->seq(), 3);
  EXPECT_EQ(db_->GetJob("j")->state(), v1::SUCCEEDED);

  std::vector<v1::JobEvent> after1 = *db_->EventsAfter("j", 1, 0);
  ASSERT_EQ(after1.size(), 2u);
  EXPECT_EQ(after1[0].seq(), 2);
  EXPECT_EQ(after1[0].progress().batches_done(), 3);
  EXPECT_EQ(after1[1].state(), v1::SUCCEEDED);
  EXPECT_EQ(db_->EventsAfter("j", 0, 2)->size(), 2u);  // limit
  EXPECT_EQ(db_->EventsAfter("j", 3, 0)->size(), 0u);

  EXPECT_TRUE(
      absl::IsNotFound(db_->UpdateJob(MakeJob("nope", v1::RUNNING), StateEvent(v1::RUNNING)).status()));
  EXPECT_TRUE(absl::IsNotFound(db_->AppendEvent("nope", progress).status()));
  EXPECT_TRUE(absl::IsNotFound(db_->EventsAfter("nope", 0, 0).status()));
  // A failed update wrote no event.
  EXPECT_EQ(db_->EventsAfter("j", 0, 0)->size(), 3u);
}

TEST_P(MetadataStoreTest, ListJobsByStateNewestFirstWithPages) {
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(
        db_->CreateJob(MakeJob(absl::StrCat("j", i), i % 2 == 0 ? v1::QUEUED : v1::RUNNING), nullptr).ok());
  }
  // j1 finishes: the state filter follows the update.
  v1::Job j1 = *db_->GetJob("j1");
  j1.set_state(v1::SUCCEEDED);
  ASSERT_TRUE(db_->UpdateJob(j1, StateEvent(v1::SUCCEEDED)).ok());

  std::vector<std::string> queued;
  std::string token;
  do {
    absl::StatusOr<JobPage> page = db_->ListJobs("", {v1::QUEUED}, 3, token);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->jobs.size(), 3u);
    for (const auto& j : page->jobs) queued.push_back(j.id());
    token = page->next_page_token;
  } while (!token.empty());
  EXPECT_EQ(queued, (std::vector<std::string>{"j6", "j4", "j2", "j0"}));

  EXPECT_EQ(Ids(db_->ListJobs("", {v1::RUNNING, v1::SUCCEEDED}, 0, "")->jobs),
            (std::vector<std::string>{"j5", "j3", "j1"}));
  EXPECT_EQ(Ids(db_->ListJobs("", {v1::SUCCEEDED}, 0, "")->jobs), (std::vector<std::string>{"j1"}));
  EXPECT_EQ(db_->ListJobs("", {}, 0, "")->jobs.size(), 7u);
  // An exact last page has no next token.
  EXPECT_TRUE(db_->ListJobs("", {}, 7, "")->next_page_token.empty());

  EXPECT_EQ(Ids(*db_->JobsInStates({v1::QUEUED, v1::RUNNING})),
            (std::vector<std::string>{"j0", "j2", "j3", "j4", "j5", "j6"}));  // oldest first
  EXPECT_TRUE(db_->JobsInStates({v1::CANCELLED})->empty());

  // Repeated states count once; values outside the enum (proto3 lets clients send any
  // int) match nothing rather than meaning "all".
  EXPECT_EQ(Ids(db_->ListJobs("", {v1::SUCCEEDED, v1::SUCCEEDED, static_cast<v1::JobState>(99)}, 0, "")->jobs),
            (std::vector<std::string>{"j1"}));
  EXPECT_TRUE(db_->ListJobs("", {static_cast<v1::JobState>(99)}, 0, "")->jobs.empty());
  EXPECT_TRUE(db_->JobsInStates({static_cast<v1::JobState>(-1)})->empty());
}

TEST_P(MetadataStoreTest, CountJobsUsingModel) {
  ASSERT_TRUE(db_->CreateJob(MakeJob("a", v1::QUEUED, "", "sha256:x"), nullptr).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("b", v1::RUNNING, "", "sha256:x"), nullptr).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("c", v1::SUCCEEDED, "", "sha256:x"), nullptr).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("d", v1::QUEUED, "", "sha256:y"), nullptr).ok());
  EXPECT_EQ(*db_->CountJobsUsingModel("t", "sha256:x", {v1::QUEUED, v1::RUNNING, v1::CANCELLING}), 2);
  EXPECT_EQ(*db_->CountJobsUsingModel("t", "sha256:x", {}), 3);
  EXPECT_EQ(*db_->CountJobsUsingModel("t", "sha256:z", {v1::QUEUED}), 0);
}

TEST_P(MetadataStoreTest, Results) {
  ASSERT_TRUE(db_->CreateJob(MakeJob("j", v1::RUNNING), nullptr).ok());
  EXPECT_TRUE(absl::IsNotFound(db_->GetResult("j", v1::MODEL).status()));
  EXPECT_FALSE(*db_->BlobReferenced("aaaa"));
  ASSERT_TRUE(db_->PutResult("j", v1::MODEL, ResultRef{"aaaa", 10}).ok());
  ASSERT_TRUE(db_->PutResult("j", v1::REPORT, ResultRef{"bbbb", 20}).ok());
  ASSERT_TRUE(db_->PutResult("j", v1::REPORT, ResultRef{"cccc", 30}).ok());  // replaces
  EXPECT_EQ(db_->GetResult("j", v1::MODEL)->sha256, "aaaa");
  EXPECT_EQ(db_->GetResult("j", v1::REPORT)->size, 30);
  EXPECT_TRUE(*db_->BlobReferenced("aaaa"));
  EXPECT_FALSE(*db_->BlobReferenced("bbbb"));
  EXPECT_TRUE(absl::IsNotFound(db_->GetResult("j", v1::BN_BUFFERS).status()));
  EXPECT_TRUE(absl::IsNotFound(db_->PutResult("nope", v1::MODEL, ResultRef{"aaaa", 1})));
  EXPECT_TRUE(absl::IsInvalidArgument(db_->PutResult("j", v1::ARTIFACT_UNSPECIFIED, ResultRef{"aaaa", 1})));
}

TEST_P(MetadataStoreTest, EverythingSurvivesReopen) {
  {
    MetadataStore* db = db_.get();
    ASSERT_TRUE(db->PutModel(MakeModel("sha256:m", "resnet")).ok());
    v1::Job job = MakeJob("j", v1::QUEUED, "req");
    ASSERT_TRUE(db->CreateJob(job, nullptr).ok());
    job.set_state(v1::RUNNING);
    ASSERT_TRUE(db->UpdateJob(job, StateEvent(v1::RUNNING)).ok());
    ASSERT_TRUE(db->PutResult("j", v1::MODEL, ResultRef{"abcd", 5}).ok());
  }
  db_.reset();
  db_ = OpenDb(spec_);
  ASSERT_NE(db_, nullptr);
  MetadataStore* db = db_.get();
  EXPECT_EQ(db->GetModel("t", "sha256:m")->name(), "resnet");
  EXPECT_EQ(db->GetJob("j")->state(), v1::RUNNING);
  EXPECT_EQ(db->EventsAfter("j", 0, 0)->size(), 1u);
  EXPECT_EQ(db->GetResult("j", v1::MODEL)->size, 5);
  bool created = true;
  EXPECT_EQ(db->CreateJob(MakeJob("other", v1::QUEUED, "req"), &created)->id(), "j");
  EXPECT_FALSE(created);
  // Sequences continue where they were.
  v1::JobEvent e;
  e.mutable_progress()->set_batches_done(1);
  EXPECT_EQ(db->AppendEvent("j", e)->seq(), 2);
  ASSERT_TRUE(db->CreateJob(MakeJob("k", v1::QUEUED), nullptr).ok());
  EXPECT_EQ(Ids(db->ListJobs("", {}, 0, "")->jobs), (std::vector<std::string>{"k", "j"}));
}

TEST_P(MetadataStoreTest, ConcurrentEventsKeepSeqUniqueAndDense) {
  ASSERT_TRUE(db_->CreateJob(MakeJob("j", v1::RUNNING), nullptr).ok());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 15;
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> seqs(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        absl::StatusOr<v1::JobEvent> e;
        if (i % 2 == 0) {
          e = db_->UpdateJob(MakeJob("j", v1::RUNNING), StateEvent(v1::RUNNING));
        } else {
          v1::JobEvent p;
          p.mutable_progress()->set_batches_done(i);
          e = db_->AppendEvent("j", p);
        }
        ASSERT_TRUE(e.ok()) << e.status();
        seqs[t].push_back(e->seq());
      }
    });
  }
  for (auto& t : threads) t.join();
  std::set<int64_t> all;
  for (const auto& s : seqs) all.insert(s.begin(), s.end());
  ASSERT_EQ(all.size(), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kPerThread);
  std::vector<v1::JobEvent> stored = *db_->EventsAfter("j", 0, 0);
  ASSERT_EQ(stored.size(), all.size());
  for (size_t i = 0; i < stored.size(); ++i) EXPECT_EQ(stored[i].seq(), static_cast<int64_t>(i) + 1);
}

// The cluster mode: every recal-server process has its own store object on one database.
TEST_P(MetadataStoreTest, TwoStoresOnOneDatabaseSeeEachOthersWrites) {
  std::unique_ptr<MetadataStore> other = OpenDb(spec_);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(db_->PutModel(MakeModel("sha256:a", "mine")).ok());
  EXPECT_EQ(other->GetModel("t", "sha256:a")->name(), "mine");
  EXPECT_EQ(other->PutModel(MakeModel("sha256:a", "again"))->name(), "mine");

  bool created = false;
  ASSERT_TRUE(other->CreateJob(MakeJob("j", v1::QUEUED, "key"), &created).ok());
  EXPECT_EQ(db_->GetJob("j")->state(), v1::QUEUED);
  EXPECT_EQ(db_->CreateJob(MakeJob("k", v1::QUEUED, "key"), &created)->id(), "j");
  EXPECT_FALSE(created);
  EXPECT_TRUE(absl::IsAlreadyExists(db_->CreateJob(MakeJob("j", v1::QUEUED), &created).status()));

  v1::Job job = *db_->GetJob("j");
  job.set_state(v1::RUNNING);
  ASSERT_TRUE(db_->UpdateJob(job, StateEvent(v1::RUNNING)).ok());
  EXPECT_EQ(Ids(*other->JobsInStates({v1::RUNNING})), std::vector<std::string>{"j"});
  EXPECT_EQ(other->AppendEvent("j", StateEvent(v1::RUNNING))->seq(), 2);
  job.set_state(v1::SUCCEEDED);
  ASSERT_TRUE(other->CommitJob(job, {StateEvent(v1::SUCCEEDED)}, {{v1::MODEL, ResultRef{"ab", 7}}}).ok());
  EXPECT_EQ(db_->EventsAfter("j", 0, 0)->size(), 3u);
  EXPECT_EQ(db_->GetResult("j", v1::MODEL)->size, 7);
  EXPECT_TRUE(*db_->BlobReferenced("ab"));
  EXPECT_EQ(db_->Usage("t")->stored_bytes, 42 + 7);

  ASSERT_TRUE(other->DeleteModel("t", "sha256:a").ok());
  EXPECT_TRUE(absl::IsNotFound(db_->GetModel("t", "sha256:a").status()));
  EXPECT_FALSE(*db_->ModelStoredByAnyTenant("sha256:a"));
}

// Two processes' writers on one job: seq is assigned under the job's lock, never twice.
TEST_P(MetadataStoreTest, ConcurrentWritersOnTwoStoresKeepSeqUniqueAndDense) {
  std::unique_ptr<MetadataStore> other = OpenDb(spec_);
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(db_->CreateJob(MakeJob("j", v1::RUNNING), nullptr).ok());
  constexpr int kThreads = 4;  // two on each store
  constexpr int kPerThread = 12;
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> seqs(kThreads);
  std::vector<int> events(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    MetadataStore* store = t % 2 == 0 ? db_.get() : other.get();
    threads.emplace_back([&, t, store] {
      for (int i = 0; i < kPerThread; ++i) {
        if (i % 3 == 0) {
          // Two events and a result in one transaction, as a job's end is written.
          const absl::Status s = store->CommitJob(MakeJob("j", v1::RUNNING),
                                                  {StateEvent(v1::RUNNING), StateEvent(v1::RUNNING)},
                                                  {{v1::REPORT, ResultRef{absl::StrCat("r", t), 1}}});
          ASSERT_TRUE(s.ok()) << s;
          events[t] += 2;
          continue;
        }
        absl::StatusOr<v1::JobEvent> e = i % 3 == 1
                                             ? store->UpdateJob(MakeJob("j", v1::RUNNING), StateEvent(v1::RUNNING))
                                             : store->AppendEvent("j", StateEvent(v1::RUNNING));
        ASSERT_TRUE(e.ok()) << e.status();
        seqs[t].push_back(e->seq());
        events[t] += 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  std::set<int64_t> returned;
  size_t returned_count = 0;
  for (const auto& s : seqs) {
    returned.insert(s.begin(), s.end());
    returned_count += s.size();
  }
  EXPECT_EQ(returned.size(), returned_count) << "a seq was handed out twice";
  int total = 0;
  for (const int n : events) total += n;
  std::vector<v1::JobEvent> stored = *OpenDb(spec_)->EventsAfter("j", 0, 0);
  ASSERT_EQ(stored.size(), static_cast<size_t>(total));
  for (size_t i = 0; i < stored.size(); ++i) EXPECT_EQ(stored[i].seq(), static_cast<int64_t>(i) + 1);
}

// Processes starting at once on a database that has no schema yet all get one.
TEST_P(MetadataStoreTest, StoresOpenedAtOnceOnAFreshDatabaseAllSucceed) {
  absl::StatusOr<std::string> fresh = FreshSpec();
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  constexpr int kStores = 4;
  std::vector<absl::StatusOr<std::unique_ptr<MetadataStore>>> stores(kStores);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kStores; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < kStores) std::this_thread::yield();
      stores[i] = OpenMetadataStore(*fresh);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStores; ++i) {
    ASSERT_TRUE(stores[i].ok()) << stores[i].status();
    ASSERT_TRUE((*stores[i])->CreateJob(MakeJob(absl::StrCat("j", i), v1::QUEUED), nullptr).ok());
  }
  EXPECT_EQ((*stores[0])->JobsInStates({})->size(), static_cast<size_t>(kStores));
}

// What the state machine does to a job it claims (JobRepository's Start, simplified).
ClaimChange ToRunning(const std::string& device) {
  return [device](v1::Job& job, std::vector<v1::JobEvent>& events) {
    job.set_state(v1::RUNNING);
    job.set_device(device);
    job.set_attempts(job.attempts() + 1);
    events.push_back(StateEvent(v1::RUNNING));
    return absl::OkStatus();
  };
}

v1::Job Prioritised(const std::string& id, int priority, const std::string& tenant) {
  v1::Job job = MakeJob(id, v1::QUEUED, "", "sha256:m", tenant);
  job.mutable_spec()->set_priority(priority);
  return job;
}

TEST_P(MetadataStoreTest, ClaimsTakePriorityThenTheLeastRecentlyServedTenantThenTheOldest) {
  bool created = false;
  for (const v1::Job& job : {Prioritised("a0", 0, "a"), Prioritised("a1", 0, "a"), Prioritised("a2", 0, "a"),
                             Prioritised("b0", 0, "b"), Prioritised("urgent", 5, "a")}) {
    ASSERT_TRUE(db_->CreateJob(job, &created).ok());
  }
  std::vector<std::string> order;
  for (int i = 0; i < 5; ++i) {
    auto claimed = db_->ClaimJob("w", absl::ToUnixMillis(absl::Now()) + 60000, ToRunning("cpu"));
    ASSERT_TRUE(claimed.ok()) << claimed.status();
    ASSERT_TRUE(claimed->has_value());
    EXPECT_EQ((*claimed)->state(), v1::RUNNING);
    order.push_back((*claimed)->id());
  }
  EXPECT_EQ(order, (std::vector<std::string>{"urgent", "b0", "a0", "a1", "a2"}));
  EXPECT_FALSE(db_->ClaimJob("w", 0, ToRunning("cpu"))->has_value());  // nothing waits
  // The claim stored the change, its event and the lease.
  const StoredJob stored = *db_->ReadJob("b0");
  EXPECT_EQ(stored.job.state(), v1::RUNNING);
  EXPECT_EQ(stored.job.attempts(), 1);
  EXPECT_EQ(stored.lease_owner, "w");
  EXPECT_EQ(db_->EventsAfter("b0", 0, 0)->back().state(), v1::RUNNING);
  EXPECT_EQ(*db_->CountJobsInStates({v1::RUNNING}), 5);
  EXPECT_EQ(*db_->CountJobsInStates({v1::QUEUED}), 0);
}

TEST_P(MetadataStoreTest, ConcurrentClaimersOnTwoStoresNeverTakeTheSameJob) {
  bool created = false;
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(db_->CreateJob(MakeJob(absl::StrCat("j", i), v1::QUEUED), &created).ok());
  std::unique_ptr<MetadataStore> other = OpenDb(spec_);
  ASSERT_NE(other, nullptr);
  std::mutex mu;
  std::multiset<std::string> claimed;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      MetadataStore* store = t % 2 == 0 ? db_.get() : other.get();
      while (true) {
        auto job = store->ClaimJob(absl::StrCat("worker-", t), absl::ToUnixMillis(absl::Now()) + 60000, ToRunning("cpu"));
        if (!job.ok()) {
          ADD_FAILURE() << job.status();
          return;
        }
        if (!job->has_value()) return;
        std::lock_guard<std::mutex> lock(mu);
        claimed.insert((*job)->id());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(claimed.size(), 40u);
  EXPECT_EQ(std::set<std::string>(claimed.begin(), claimed.end()).size(), 40u) << "a job was claimed twice";
  for (const std::string& id : claimed) EXPECT_EQ(db_->ReadJob(id)->job.attempts(), 1) << id;
}

TEST_P(MetadataStoreTest, LeasesAreRenewedByTheirOwnerOnlyAndExpire) {
  bool created = false;
  ASSERT_TRUE(db_->CreateJob(MakeJob("j", v1::QUEUED), &created).ok());
  const int64_t now = absl::ToUnixMillis(absl::Now());
  ASSERT_TRUE((*db_->ClaimJob("w1", now + 1000, ToRunning("cpu"))).has_value());
  EXPECT_EQ(*db_->RenewLease("j", "w1", now + 5000), v1::RUNNING);
  EXPECT_TRUE(absl::IsFailedPrecondition(db_->RenewLease("j", "w2", now + 5000).status()));
  EXPECT_TRUE(db_->JobsWithExpiredLeases(now + 4000)->empty());
  auto expired = db_->JobsWithExpiredLeases(now + 6000);
  ASSERT_EQ(expired->size(), 1u);
  EXPECT_EQ(expired->front().lease_owner, "w1");

  // A cancel is what the renewal tells the worker; an end drops the lease.
  StoredJob stored = *db_->ReadJob("j");
  stored.job.set_state(v1::CANCELLING);
  ASSERT_TRUE(db_->CommitJob(stored.job, {StateEvent(v1::CANCELLING)}, {}, stored.version).ok());
  EXPECT_EQ(*db_->RenewLease("j", "w1", now + 5000), v1::CANCELLING);
  stored = *db_->ReadJob("j");
  stored.job.set_state(v1::CANCELLED);
  ASSERT_TRUE(db_->CommitJob(stored.job, {StateEvent(v1::CANCELLED)}, {}, stored.version).ok());
  EXPECT_EQ(db_->ReadJob("j")->lease_owner, "");
  EXPECT_TRUE(absl::IsFailedPrecondition(db_->RenewLease("j", "w1", now + 5000).status()));
  EXPECT_TRUE(db_->JobsWithExpiredLeases(now + 100000)->empty());
}

TEST_P(MetadataStoreTest, WorkerEndpointsAreKeptByOwnerAndForgottenOnlyWhenStaleAndLeaseless) {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  EXPECT_TRUE(absl::IsNotFound(db_->WorkerEndpoint("w1").status()));
  ASSERT_TRUE(db_->PutWorkerEndpoint("w1", "10.0.0.1:50052", now).ok());
  EXPECT_EQ(*db_->WorkerEndpoint("w1"), "10.0.0.1:50052");
  ASSERT_TRUE(db_->PutWorkerEndpoint("w1", "10.0.0.9:50052", now).ok());  // a worker that moved
  EXPECT_EQ(*db_->WorkerEndpoint("w1"), "10.0.0.9:50052");
  // Another store on the database (an api replica) reads what the worker wrote.
  std::unique_ptr<MetadataStore> other = OpenDb(spec_);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(*other->WorkerEndpoint("w1"), "10.0.0.9:50052");

  // Long unrefreshed: forgotten at the next put, unless the worker still holds a lease.
  bool created = false;
  ASSERT_TRUE(db_->CreateJob(MakeJob("j", v1::QUEUED), &created).ok());
  ASSERT_TRUE((*db_->ClaimJob("w-old-busy", now + 60000, ToRunning("cpu"))).has_value());
  const int64_t long_ago = now - kForgetWorkerEndpointAfterMs - 1000;
  ASSERT_TRUE(db_->PutWorkerEndpoint("w-old-idle", "10.0.0.2:1", long_ago).ok());
  ASSERT_TRUE(db_->PutWorkerEndpoint("w-old-busy", "10.0.0.3:1", long_ago).ok());
  ASSERT_TRUE(db_->PutWorkerEndpoint("w2", "10.0.0.4:1", now).ok());
  EXPECT_TRUE(absl::IsNotFound(db_->WorkerEndpoint("w-old-idle").status()));
  EXPECT_EQ(*db_->WorkerEndpoint("w-old-busy"), "10.0.0.3:1");
  EXPECT_EQ(*db_->WorkerEndpoint("w1"), "10.0.0.9:50052");
  // It survives a reopen (it is in the schema, not in memory).
  db_.reset();
  db_ = OpenDb(spec_);
  ASSERT_NE(db_, nullptr);
  EXPECT_EQ(*db_->WorkerEndpoint("w2"), "10.0.0.4:1");
}

TEST_P(MetadataStoreTest, LiveWorkerEndpointsAreThoseHeardFromSinceEachOnceNewestFirst) {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  EXPECT_TRUE(db_->LiveWorkerEndpoints(now - 30000)->empty());
  ASSERT_TRUE(db_->PutWorkerEndpoint("w-quiet", "10.0.0.1:1", now - 60000).ok());  // stopped, or cut off
  ASSERT_TRUE(db_->PutWorkerEndpoint("w-a", "10.0.0.2:1", now - 20000).ok());
  ASSERT_TRUE(db_->PutWorkerEndpoint("w-b", "10.0.0.3:1", now - 1000).ok());
  // A process restarted on the same address under a new owner name: one address, not two.
  ASSERT_TRUE(db_->PutWorkerEndpoint("w-a-again", "10.0.0.2:1", now - 10000).ok());
  EXPECT_THAT(*db_->LiveWorkerEndpoints(now - 30000), ::testing::ElementsAre("10.0.0.3:1", "10.0.0.2:1"));
  EXPECT_THAT(*db_->LiveWorkerEndpoints(now - 5000), ::testing::ElementsAre("10.0.0.3:1"));
  EXPECT_THAT(*db_->LiveWorkerEndpoints(now - 120000),
              ::testing::ElementsAre("10.0.0.3:1", "10.0.0.2:1", "10.0.0.1:1"));
}

TEST_P(MetadataStoreTest, AWriteAgainstAVersionAnotherWriterChangedIsRefused) {
  bool created = false;
  ASSERT_TRUE(db_->CreateJob(MakeJob("j", v1::QUEUED), &created).ok());
  std::unique_ptr<MetadataStore> other = OpenDb(spec_);
  const StoredJob mine = *db_->ReadJob("j");
  StoredJob theirs = *other->ReadJob("j");
  theirs.job.set_state(v1::CANCELLED);
  ASSERT_TRUE(other->CommitJob(theirs.job, {StateEvent(v1::CANCELLED)}, {}, theirs.version).ok());
  v1::Job stale = mine.job;
  stale.set_state(v1::RUNNING);
  const absl::Status refused = db_->CommitJob(stale, {StateEvent(v1::RUNNING)}, {}, mine.version);
  EXPECT_TRUE(absl::IsAborted(refused)) << refused;
  EXPECT_EQ(db_->ReadJob("j")->job.state(), v1::CANCELLED);
  EXPECT_EQ(db_->EventsAfter("j", 0, 0)->size(), 1u);  // the refused write left no event
  EXPECT_GT(db_->ReadJob("j")->version, mine.version);
  EXPECT_TRUE(absl::IsNotFound(db_->CommitJob(MakeJob("nope", v1::RUNNING), {}, {}, 0)));
}

TEST_P(MetadataStoreTest, AWriteInOneProcessIsToldToWatchersOfAnother) {
  std::mutex mu;
  std::condition_variable told;
  int calls = 0;
  std::unique_ptr<ChangeWatch> watch = db_->WatchChanges([&] {
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    told.notify_all();
  });
  if (GetParam() == "sqlite") {
    EXPECT_EQ(watch, nullptr) << "SQLite cannot tell other processes' writes: its watchers poll";
    return;
  }
  ASSERT_NE(watch, nullptr);
  auto wait_for = [&](int at_least) {
    std::unique_lock<std::mutex> lock(mu);
    return told.wait_for(lock, std::chrono::seconds(5), [&] { return calls >= at_least; });
  };
  ASSERT_TRUE(wait_for(1)) << "told once when it starts listening";
  int before;
  {
    std::lock_guard<std::mutex> lock(mu);
    before = calls;
  }
  std::unique_ptr<MetadataStore> other = OpenDb(spec_);  // another process, as far as the database knows
  bool created = false;
  ASSERT_TRUE(other->CreateJob(MakeJob("j", v1::QUEUED), &created, {StateEvent(v1::QUEUED)}).ok());
  EXPECT_TRUE(wait_for(before + 1)) << "a job created elsewhere";
  {
    std::lock_guard<std::mutex> lock(mu);
    before = calls;
  }
  ASSERT_TRUE(other->ClaimJob("w", absl::ToUnixMillis(absl::Now()) + 60000, ToRunning("cpu"))->has_value());
  EXPECT_TRUE(wait_for(before + 1)) << "a claim elsewhere";
  watch.reset();  // stops (and joins) before the callback's state goes
}

// ------------------------------------------------------------------------ sharded jobs

// A sharded job as CreateJob takes it: the parent (spec.shards = `shards`) with its QUEUED
// event, and its shards, each with its own QUEUED event, in the order `order` gives their
// indexes (the store returns them by index whatever the order they were stored in).
struct ShardedJob {
  v1::Job parent;
  std::vector<v1::JobEvent> events;
  std::vector<NewJob> children;
};

ShardedJob MakeSharded(const std::string& id, int shards, const std::string& request_id = "",
                       std::vector<int> order = {}) {
  if (order.empty()) {
    for (int i = 0; i < shards; ++i) order.push_back(i);
  }
  ShardedJob sharded;
  sharded.parent = MakeJob(id, v1::QUEUED, request_id);
  sharded.parent.mutable_spec()->set_shards(shards);
  sharded.events = {StateEvent(v1::QUEUED)};
  for (const int i : order) {
    NewJob child;
    child.job = MakeJob(absl::StrCat(id, "-", i), v1::QUEUED);
    child.job.mutable_spec()->set_shards(shards);
    child.job.set_parent_id(id);
    child.job.set_shard(i);
    child.events = {StateEvent(v1::QUEUED)};
    sharded.children.push_back(std::move(child));
  }
  return sharded;
}

absl::StatusOr<v1::Job> Create(MetadataStore& db, ShardedJob sharded, bool* created = nullptr,
                               const JobQuota& quota = {}) {
  return db.CreateJob(sharded.parent, created, std::move(sharded.events), std::move(sharded.children), quota);
}

TEST_P(MetadataStoreTest, AShardedJobIsStoredWithItsShardsInOneTransaction) {
  bool created = false;
  absl::StatusOr<v1::Job> parent = Create(*db_, MakeSharded("p", 3, "req", {2, 0, 1}), &created);
  ASSERT_TRUE(parent.ok()) << parent.status();
  EXPECT_TRUE(created);
  EXPECT_EQ(parent->id(), "p");
  EXPECT_TRUE(IsCoordinated(*parent));
  // By shard index, not by the order they were given in.
  absl::StatusOr<std::vector<v1::Job>> children = db_->ChildJobs("p");
  ASSERT_TRUE(children.ok()) << children.status();
  EXPECT_EQ(Ids(*children), (std::vector<std::string>{"p-0", "p-1", "p-2"}));
  for (int i = 0; i < 3; ++i) {
    const v1::Job& child = (*children)[i];
    EXPECT_EQ(child.parent_id(), "p");
    EXPECT_EQ(child.shard(), i);
    EXPECT_FALSE(IsCoordinated(child));
    EXPECT_EQ(db_->GetJob(child.id())->parent_id(), "p");
    // Each with its own events, numbered and timed as the parent's are.
    std::vector<v1::JobEvent> events = *db_->EventsAfter(child.id(), 0, 0);
    ASSERT_EQ(events.size(), 1u) << child.id();
    EXPECT_EQ(events[0].seq(), 1);
    EXPECT_EQ(events[0].state(), v1::QUEUED);
    EXPECT_GT(events[0].time().seconds(), 1600000000);
  }
  std::vector<v1::JobEvent> parent_events = *db_->EventsAfter("p", 0, 0);
  ASSERT_EQ(parent_events.size(), 1u);
  EXPECT_EQ(parent_events[0].seq(), 1);
  EXPECT_EQ(db_->JobsInStates({})->size(), 4u);

  // A retry with the parent's request_id returns the parent and stores no second set of shards.
  ShardedJob retry = MakeSharded("p-retry", 3, "req");
  absl::StatusOr<v1::Job> again = Create(*db_, retry, &created);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(created);
  EXPECT_EQ(again->id(), "p");
  EXPECT_TRUE(absl::IsNotFound(db_->GetJob("p-retry").status()));
  EXPECT_TRUE(absl::IsNotFound(db_->GetJob("p-retry-0").status()));
  EXPECT_EQ(db_->ChildJobs("p")->size(), 3u);
  EXPECT_EQ(db_->JobsInStates({})->size(), 4u);

  // All or nothing: a shard whose id is taken (by another job, or by a sibling) leaves
  // neither the parent nor any shard, nor their events.
  ShardedJob clash = MakeSharded("q", 3, "req-q");
  clash.children[2].job.set_id("p-1");
  clash.children[2].job.set_parent_id("q");
  EXPECT_TRUE(absl::IsAlreadyExists(Create(*db_, clash, &created).status()));
  ShardedJob twins = MakeSharded("q", 2);
  twins.children[1].job.set_id("q-0");
  EXPECT_TRUE(absl::IsAlreadyExists(Create(*db_, twins, &created).status()));
  for (const std::string id : {"q", "q-0", "q-1"}) {
    EXPECT_TRUE(absl::IsNotFound(db_->GetJob(id).status())) << id;
    EXPECT_TRUE(absl::IsNotFound(db_->EventsAfter(id, 0, 0).status())) << id;
  }
  EXPECT_TRUE(db_->ChildJobs("q")->empty());
  EXPECT_TRUE(absl::IsNotFound(db_->FindJobByRequestId("t", "req-q").status()));
  EXPECT_EQ(db_->JobsInStates({})->size(), 4u);
  // The request_id of the failed creation is free: the same job is then stored whole.
  ASSERT_TRUE(Create(*db_, MakeSharded("q", 3, "req-q"), &created).ok());
  EXPECT_TRUE(created);
  EXPECT_EQ(Ids(*db_->ChildJobs("q")), (std::vector<std::string>{"q-0", "q-1", "q-2"}));

  // Shards belong to the job they are stored with: same tenant, its id as parent_id, no
  // request_id of their own.
  ShardedJob stray = MakeSharded("r", 2);
  stray.children[0].job.set_parent_id("p");
  EXPECT_TRUE(absl::IsInvalidArgument(Create(*db_, stray).status()));
  ShardedJob keyed = MakeSharded("r", 2);
  keyed.children[1].job.set_request_id("mine");
  EXPECT_TRUE(absl::IsInvalidArgument(Create(*db_, keyed).status()));
  ShardedJob foreign = MakeSharded("r", 2);
  foreign.children[1].job.set_tenant("u");
  EXPECT_TRUE(absl::IsInvalidArgument(Create(*db_, foreign).status()));
  EXPECT_TRUE(absl::IsNotFound(db_->GetJob("r").status()));

  // A job without shards has none; so has one that does not exist.
  ASSERT_TRUE(db_->CreateJob(MakeJob("plain", v1::QUEUED), nullptr).ok());
  EXPECT_TRUE(db_->ChildJobs("plain")->empty());
  EXPECT_TRUE(db_->ChildJobs("nope")->empty());
  EXPECT_TRUE(db_->ChildJobs("")->empty());

  // A shard stored later under an index that is taken (a redone shard) comes after the
  // first: by index, then by creation.
  v1::Job redo = *db_->GetJob("p-1");
  redo.set_id("p-1-redo");
  ASSERT_TRUE(db_->CreateJob(redo, &created, {StateEvent(v1::QUEUED)}).ok());
  EXPECT_EQ(Ids(*db_->ChildJobs("p")), (std::vector<std::string>{"p-0", "p-1", "p-1-redo", "p-2"}));

  // All of it survives a reopen.
  db_.reset();
  db_ = OpenDb(spec_);
  ASSERT_NE(db_, nullptr);
  EXPECT_EQ(Ids(*db_->ChildJobs("p")), (std::vector<std::string>{"p-0", "p-1", "p-1-redo", "p-2"}));
  EXPECT_EQ(db_->GetJob("q-2")->shard(), 2);
}

TEST_P(MetadataStoreTest, ListsAndCountsOfJobsLeaveShardsOut) {
  ASSERT_TRUE(db_->PutModel(MakeModel("sha256:m", "", "t")).ok());  // 42 bytes
  bool created = false;
  ASSERT_TRUE(db_->CreateJob(MakeJob("plain", v1::QUEUED), &created).ok());
  ASSERT_TRUE(Create(*db_, MakeSharded("p", 3), &created).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("done", v1::SUCCEEDED), &created).ok());
  // One shard runs, one has ended.
  v1::Job running = *db_->GetJob("p-0");
  running.set_state(v1::RUNNING);
  ASSERT_TRUE(db_->UpdateJob(running, StateEvent(v1::RUNNING)).ok());
  v1::Job ended = *db_->GetJob("p-1");
  ended.set_state(v1::SUCCEEDED);
  ASSERT_TRUE(db_->CommitJob(ended, {StateEvent(v1::SUCCEEDED)}, {{v1::REPORT, ResultRef{"shard", 100}}}).ok());
  ASSERT_TRUE(db_->PutResult("done", v1::MODEL, ResultRef{"done", 10}).ok());

  EXPECT_EQ(Ids(db_->ListJobs("", {}, 0, "")->jobs), (std::vector<std::string>{"done", "p", "plain"}));
  EXPECT_EQ(Ids(db_->ListJobs("t", {v1::QUEUED}, 0, "")->jobs), (std::vector<std::string>{"p", "plain"}));
  EXPECT_TRUE(db_->ListJobs("", {v1::RUNNING}, 0, "")->jobs.empty());
  // Pages over top-level jobs only, the shards' create_seq in between notwithstanding.
  std::vector<std::string> paged;
  std::string token;
  do {
    absl::StatusOr<JobPage> page = db_->ListJobs("t", {}, 1, token);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const v1::Job& job : page->jobs) paged.push_back(job.id());
    token = page->next_page_token;
  } while (!token.empty() && paged.size() < 10);
  EXPECT_EQ(paged, (std::vector<std::string>{"done", "p", "plain"}));

  const TenantUsage usage = *db_->Usage("t");
  EXPECT_EQ(usage.active_jobs, 2);               // plain and p; not p-0 (running) nor p-2 (queued)
  EXPECT_EQ(usage.stored_bytes, 42 + 10 + 100);  // a shard's results are stored bytes all the same
  EXPECT_EQ(*db_->CountJobsInStates({v1::QUEUED}), 2);
  EXPECT_EQ(*db_->CountJobsInStates({v1::RUNNING}), 0);
  EXPECT_EQ(*db_->CountJobsInStates({}), 3);
  EXPECT_EQ(*db_->CountJobsUsingModel("t", "sha256:m", {v1::QUEUED, v1::RUNNING, v1::CANCELLING}), 2);
  EXPECT_EQ(*db_->CountJobsUsingModel("t", "sha256:m", {}), 3);

  // What workers and recovery read sees every job, shards included.
  EXPECT_EQ(Ids(*db_->JobsInStates({v1::QUEUED})), (std::vector<std::string>{"plain", "p", "p-2"}));
  EXPECT_EQ(Ids(*db_->JobsInStates({v1::RUNNING, v1::SUCCEEDED})), (std::vector<std::string>{"p-0", "p-1", "done"}));
  EXPECT_EQ(db_->GetJob("p-2")->state(), v1::QUEUED);
  EXPECT_EQ(db_->ReadJob("p-1")->job.state(), v1::SUCCEEDED);
  EXPECT_EQ(db_->GetResult("p-1", v1::REPORT)->size, 100);
  EXPECT_TRUE(*db_->BlobReferenced("shard"));
}

TEST_P(MetadataStoreTest, RunClaimsTakeShardsAndPlainJobsAndCoordinateClaimsTakeTheirParents) {
  bool created = false;
  // The parent first and most urgent: a run claimer passes over it all the same.
  ShardedJob sharded = MakeSharded("p", 3);
  sharded.parent.mutable_spec()->set_priority(9);
  ASSERT_TRUE(Create(*db_, sharded, &created).ok());
  ASSERT_TRUE(db_->CreateJob(Prioritised("plain", 0, "t"), &created).ok());
  v1::Job one = Prioritised("one-shard", 0, "t");  // shards = 1: a plain job
  one.mutable_spec()->set_shards(1);
  ASSERT_TRUE(db_->CreateJob(one, &created).ok());

  const int64_t until = absl::ToUnixMillis(absl::Now()) + 60000;
  std::vector<std::string> run;
  while (true) {
    absl::StatusOr<std::optional<v1::Job>> claimed = db_->ClaimJob("w", until, ToRunning("cpu"), ClaimKind::kRun);
    ASSERT_TRUE(claimed.ok()) << claimed.status();
    if (!claimed->has_value()) break;
    run.push_back((*claimed)->id());
    ASSERT_LT(run.size(), 10u);
  }
  EXPECT_EQ(std::set<std::string>(run.begin(), run.end()),
            (std::set<std::string>{"p-0", "p-1", "p-2", "plain", "one-shard"}));
  EXPECT_EQ(run.size(), 5u);
  EXPECT_EQ(db_->GetJob("p")->state(), v1::QUEUED);
  // The default kind is kRun.
  EXPECT_FALSE(db_->ClaimJob("w", until, ToRunning("cpu"))->has_value());

  absl::StatusOr<std::optional<v1::Job>> coordinator =
      db_->ClaimJob("c", until, ToRunning("coordinator"), ClaimKind::kCoordinate);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  ASSERT_TRUE(coordinator->has_value());
  EXPECT_EQ((*coordinator)->id(), "p");
  EXPECT_EQ((*coordinator)->state(), v1::RUNNING);
  EXPECT_EQ(db_->ReadJob("p")->lease_owner, "c");
  EXPECT_FALSE(db_->ClaimJob("c", until, ToRunning("coordinator"), ClaimKind::kCoordinate)->has_value());

  // Shards hold leases like any job: renewed by their owner, found once expired.
  EXPECT_EQ(*db_->RenewLease("p-1", "w", until + 1000), v1::RUNNING);
  EXPECT_TRUE(absl::IsFailedPrecondition(db_->RenewLease("p-1", "c", until + 1000).status()));
  auto expired = db_->JobsWithExpiredLeases(until + 500);
  ASSERT_TRUE(expired.ok()) << expired.status();
  std::vector<std::string> expired_ids;
  for (const StoredJob& stored : *expired) expired_ids.push_back(stored.job.id());
  EXPECT_EQ(expired_ids, (std::vector<std::string>{"p", "p-0", "p-2", "plain", "one-shard"}));
  // A coordinated job queued again (its coordinator gone) is a coordinate claim again.
  StoredJob parent = *db_->ReadJob("p");
  parent.job.set_state(v1::QUEUED);
  ASSERT_TRUE(db_->CommitJob(parent.job, {StateEvent(v1::QUEUED)}, {}, parent.version).ok());
  EXPECT_FALSE(db_->ClaimJob("w", until, ToRunning("cpu"), ClaimKind::kRun)->has_value());
  EXPECT_EQ((*db_->ClaimJob("c2", until, ToRunning("coordinator"), ClaimKind::kCoordinate))->id(), "p");
}

TEST_P(MetadataStoreTest, ConcurrentRunAndCoordinateClaimersOnTwoStoresTakeEachJobOnce) {
  bool created = false;
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(Create(*db_, MakeSharded(absl::StrCat("s", i), 4), &created).ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(db_->CreateJob(MakeJob(absl::StrCat("j", i), v1::QUEUED), &created).ok());
  std::unique_ptr<MetadataStore> other = OpenDb(spec_);
  ASSERT_NE(other, nullptr);
  std::mutex mu;
  std::multiset<std::string> ran, coordinated;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      MetadataStore* store = t % 2 == 0 ? db_.get() : other.get();
      const ClaimKind kind = t < 2 ? ClaimKind::kRun : ClaimKind::kCoordinate;
      while (true) {
        auto job = store->ClaimJob(absl::StrCat("worker-", t), absl::ToUnixMillis(absl::Now()) + 60000,
                                   ToRunning("cpu"), kind);
        if (!job.ok()) {
          ADD_FAILURE() << job.status();
          return;
        }
        if (!job->has_value()) return;
        std::lock_guard<std::mutex> lock(mu);
        (kind == ClaimKind::kRun ? ran : coordinated).insert((*job)->id());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(ran.size(), 6u * 4 + 6);
  EXPECT_EQ(std::set<std::string>(ran.begin(), ran.end()).size(), ran.size()) << "a job was claimed twice";
  EXPECT_EQ(std::set<std::string>(coordinated.begin(), coordinated.end()),
            (std::set<std::string>{"s0", "s1", "s2", "s3", "s4", "s5"}));
  EXPECT_EQ(coordinated.size(), 6u);
}

// ------------------------------------------------------------ running jobs per tenant

// Tenant "a" may hold one worker, "b" three; any other, as many as ask.
int64_t OneForAThreeForB(const std::string& tenant) { return tenant == "a" ? 1 : tenant == "b" ? 3 : 0; }

// What a run claimer with the bound takes next: its id, or "" when nothing may run.
std::string NextRun(MetadataStore& db, const MaxRunningJobs& bound) {
  absl::StatusOr<std::optional<v1::Job>> claimed =
      db.ClaimJob("w", absl::ToUnixMillis(absl::Now()) + 60000, ToRunning("cpu"), ClaimKind::kRun, bound);
  EXPECT_TRUE(claimed.ok()) << claimed.status();
  return claimed.ok() && claimed->has_value() ? (*claimed)->id() : "";
}

// The state machine's end of a run (or the start of its cancelling), as the worker writes it.
void MoveTo(MetadataStore& db, const std::string& id, v1::JobState state) {
  absl::StatusOr<StoredJob> stored = db.ReadJob(id);
  ASSERT_TRUE(stored.ok()) << stored.status();
  stored->job.set_state(state);
  ASSERT_TRUE(db.CommitJob(stored->job, {StateEvent(state)}, {}, stored->version).ok()) << id;
}

TEST_P(MetadataStoreTest, ATenantAtItsRunningBoundWaitsWhileAnotherTenantsLaterJobIsClaimed) {
  bool created = false;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(db_->CreateJob(Prioritised(absl::StrCat("a", i), 0, "a"), &created).ok());
  }
  ASSERT_TRUE(db_->CreateJob(Prioritised("b0", 0, "b"), &created).ok());
  const MaxRunningJobs bound = OneForAThreeForB;
  EXPECT_EQ(NextRun(*db_, bound), "a0");
  EXPECT_EQ(NextRun(*db_, bound), "b0");  // later than a1..a4, but a0 holds a's one worker
  EXPECT_EQ(NextRun(*db_, bound), "");    // however many workers ask
  EXPECT_EQ(db_->GetJob("a1")->state(), v1::QUEUED);
  // Neither a higher priority nor a shard gets past the bound.
  ASSERT_TRUE(db_->CreateJob(Prioritised("a-urgent", 50, "a"), &created).ok());
  ShardedJob sharded = MakeSharded("ap", 2);
  sharded.parent.set_tenant("a");
  for (NewJob& shard : sharded.children) shard.job.set_tenant("a");
  ASSERT_TRUE(Create(*db_, sharded, &created).ok());
  EXPECT_EQ(NextRun(*db_, bound), "");
  // A job being cancelled still holds its worker until its run has stopped.
  MoveTo(*db_, "a0", v1::CANCELLING);
  EXPECT_EQ(NextRun(*db_, bound), "");
  MoveTo(*db_, "a0", v1::CANCELLED);
  EXPECT_EQ(NextRun(*db_, bound), "a-urgent");  // the order holds among what may run
  EXPECT_EQ(NextRun(*db_, bound), "");
  MoveTo(*db_, "a-urgent", v1::SUCCEEDED);
  EXPECT_EQ(NextRun(*db_, bound), "a1");
  // Without a bound (the default) the queue is taken in its order, whatever runs.
  EXPECT_EQ(NextRun(*db_, nullptr), "a2");
  EXPECT_EQ(NextRun(*db_, [](const std::string&) -> int64_t { return 0; }), "a3");
}

TEST_P(MetadataStoreTest, ShardsCountAgainstTheRunningBoundAndTheirCoordinatedParentDoesNot) {
  bool created = false;
  ShardedJob sharded = MakeSharded("p", 3);
  sharded.parent.set_tenant("a");
  for (NewJob& shard : sharded.children) shard.job.set_tenant("a");
  ASSERT_TRUE(Create(*db_, sharded, &created).ok());
  const MaxRunningJobs bound = OneForAThreeForB;
  // The parent runs on a coordinator, not a worker: neither held back nor counted, or a
  // tenant bound to one could never run a shard of its sharded job.
  absl::StatusOr<std::optional<v1::Job>> parent = db_->ClaimJob(
      "c", absl::ToUnixMillis(absl::Now()) + 60000, ToRunning("coordinator"), ClaimKind::kCoordinate, bound);
  ASSERT_TRUE(parent.ok()) << parent.status();
  ASSERT_TRUE(parent->has_value());
  EXPECT_EQ((*parent)->id(), "p");
  // Each shard holds a worker: one at a time.
  EXPECT_EQ(NextRun(*db_, bound), "p-0");
  EXPECT_EQ(NextRun(*db_, bound), "");
  MoveTo(*db_, "p-0", v1::SUCCEEDED);
  EXPECT_EQ(NextRun(*db_, bound), "p-1");
  EXPECT_EQ(NextRun(*db_, bound), "");
}

TEST_P(MetadataStoreTest, ConcurrentClaimersOnTwoStoresNeverPassATenantsRunningBound) {
  bool created = false;
  for (const char* tenant : {"a", "b", "c"}) {
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(db_->CreateJob(Prioritised(absl::StrCat(tenant, i), 0, tenant), &created).ok());
    }
  }
  std::unique_ptr<MetadataStore> other = OpenDb(spec_);
  ASSERT_NE(other, nullptr);
  std::mutex mu;
  std::map<std::string, int> claimed_by_tenant;
  std::vector<std::thread> threads;
  // Every claimer starts at once, each on its own connection in turn: two processes' workers.
  std::atomic<int> ready{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      MetadataStore* store = t % 2 == 0 ? db_.get() : other.get();
      ++ready;
      while (ready < 6) std::this_thread::yield();
      while (true) {
        auto job = store->ClaimJob(absl::StrCat("worker-", t), absl::ToUnixMillis(absl::Now()) + 60000,
                                   ToRunning("cpu"), ClaimKind::kRun, OneForAThreeForB);
        if (!job.ok()) {
          ADD_FAILURE() << job.status();
          return;
        }
        if (!job->has_value()) return;
        std::lock_guard<std::mutex> lock(mu);
        ++claimed_by_tenant[(*job)->tenant()];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(claimed_by_tenant, (std::map<std::string, int>{{"a", 1}, {"b", 3}, {"c", 8}}));
  EXPECT_EQ(*db_->CountJobsInStates({v1::RUNNING}), 12);
}

// ------------------------------------------------------------------------------ quotas

JobQuota Quota(int64_t max_active_jobs, int64_t max_submissions_per_minute, int64_t now_ms) {
  JobQuota quota;
  quota.max_active_jobs = max_active_jobs;
  quota.max_submissions_per_minute = max_submissions_per_minute;
  quota.now_ms = now_ms;
  return quota;
}

// A fixed clock for the minute window: the store takes the submission's time from the quota.
constexpr int64_t kT0 = 1700000000000;

absl::StatusOr<v1::Job> CreateWithin(MetadataStore& db, const std::string& id, const JobQuota& quota,
                                     const std::string& request_id = "", const std::string& tenant = "t") {
  bool created = false;
  return db.CreateJob(MakeJob(id, v1::QUEUED, request_id, "sha256:m", tenant), &created, {StateEvent(v1::QUEUED)},
                      {}, quota);
}

void SetState(MetadataStore& db, const std::string& id, v1::JobState state) {
  v1::Job job = *db.GetJob(id);
  job.set_state(state);
  ASSERT_TRUE(db.UpdateJob(job, StateEvent(state)).ok());
}

TEST_P(MetadataStoreTest, CreateJobRefusesATenantAtItsActiveJobsQuota) {
  const JobQuota quota = Quota(/*max_active_jobs=*/2, 0, kT0);
  bool created = false;
  // A sharded job is one active job: its three shards are not counted.
  ASSERT_TRUE(Create(*db_, MakeSharded("p", 3), &created, quota).ok());
  ASSERT_TRUE(CreateWithin(*db_, "a", quota, "key-a").ok());
  absl::StatusOr<v1::Job> over = CreateWithin(*db_, "b", quota);
  ASSERT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_EQ(over.status().message(),
            "tenant t has 2 jobs queued or running, its quota max_active_jobs=2; retry when one has ended");
  // Nothing of it was stored.
  EXPECT_TRUE(absl::IsNotFound(db_->GetJob("b").status()));
  EXPECT_TRUE(absl::IsNotFound(db_->EventsAfter("b", 0, 0).status()));
  // A retry of a stored submission is answered with its job, over quota or not.
  absl::StatusOr<v1::Job> retried =
      db_->CreateJob(MakeJob("a-again", v1::QUEUED, "key-a"), &created, {StateEvent(v1::QUEUED)}, {}, quota);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_FALSE(created);
  EXPECT_EQ(retried->id(), "a");
  EXPECT_TRUE(absl::IsNotFound(db_->GetJob("a-again").status()));
  // Another tenant's jobs are not counted.
  ASSERT_TRUE(CreateWithin(*db_, "u1", quota, "key-a", "u").ok());
  ASSERT_TRUE(CreateWithin(*db_, "u2", quota, "", "u").ok());
  // Running and cancelling jobs are active; an ended one makes room.
  SetState(*db_, "a", v1::RUNNING);
  EXPECT_TRUE(absl::IsResourceExhausted(CreateWithin(*db_, "b", quota).status()));
  SetState(*db_, "a", v1::CANCELLING);
  EXPECT_TRUE(absl::IsResourceExhausted(CreateWithin(*db_, "b", quota).status()));
  SetState(*db_, "a", v1::CANCELLED);
  ASSERT_TRUE(CreateWithin(*db_, "b", quota).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(CreateWithin(*db_, "c", quota).status()));
  // Shards that run or end change nothing: only the sharded job itself counts.
  SetState(*db_, "p-0", v1::RUNNING);
  SetState(*db_, "p-1", v1::SUCCEEDED);
  EXPECT_TRUE(absl::IsResourceExhausted(CreateWithin(*db_, "c", quota).status()));
  // No limit: the same store takes it.
  ASSERT_TRUE(CreateWithin(*db_, "c", Quota(0, 0, kT0)).ok());

  // Both limits reached: the active jobs' is named (it is checked first).
  const JobQuota both = Quota(1, 1, kT0);
  ASSERT_TRUE(CreateWithin(*db_, "w1", both, "", "w").ok());
  absl::StatusOr<v1::Job> refused = CreateWithin(*db_, "w2", both, "", "w");
  ASSERT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("max_active_jobs=1"), absl::string_view::npos) << refused.status();
}

TEST_P(MetadataStoreTest, CreateJobRefusesATenantAtItsSubmissionsPerMinuteAsTheMinuteSlides) {
  const auto at = [](int64_t ms) { return Quota(0, /*max_submissions_per_minute=*/3, kT0 + ms); };
  bool created = false;
  // A sharded job is one submission: its three shards are not counted.
  ASSERT_TRUE(Create(*db_, MakeSharded("p", 3), &created, at(0)).ok());
  ASSERT_TRUE(CreateWithin(*db_, "a", at(1000), "key-a").ok());
  ASSERT_TRUE(CreateWithin(*db_, "b", at(2000)).ok());
  // Submissions, not active jobs: one that has ended still counts.
  SetState(*db_, "a", v1::CANCELLED);
  absl::StatusOr<v1::Job> over = CreateWithin(*db_, "c", at(59999));
  ASSERT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
  EXPECT_EQ(over.status().message(),
            "tenant t submitted 3 jobs in the last minute, its quota max_submissions_per_minute=3; retry later");
  EXPECT_TRUE(absl::IsNotFound(db_->GetJob("c").status()));
  // A retry is answered with its job; another tenant has its own minute.
  absl::StatusOr<v1::Job> retried =
      db_->CreateJob(MakeJob("a-again", v1::QUEUED, "key-a"), &created, {}, {}, at(59999));
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_FALSE(created);
  EXPECT_EQ(retried->id(), "a");
  ASSERT_TRUE(CreateWithin(*db_, "u1", at(59999), "", "u").ok());

  // A minute after p, p is out of the window (and the refused c never was in it).
  ASSERT_TRUE(CreateWithin(*db_, "c", at(60000)).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(CreateWithin(*db_, "d", at(60500)).status()));
  // A minute after a and b, both are out: c and two more.
  ASSERT_TRUE(CreateWithin(*db_, "d", at(62000)).ok());
  ASSERT_TRUE(CreateWithin(*db_, "e", at(62000)).ok());
  absl::StatusOr<v1::Job> again = CreateWithin(*db_, "f", at(62000));
  ASSERT_TRUE(absl::IsResourceExhausted(again.status())) << again.status();
  EXPECT_NE(again.status().message().find("submitted 3 jobs"), absl::string_view::npos) << again.status();
  EXPECT_EQ(Ids(db_->ListJobs("t", {}, 0, "")->jobs), (std::vector<std::string>{"e", "d", "c", "b", "a", "p"}));
}

// Runs `body(t)` for t in [0, threads) on threads that all start at once; returns when all
// have ended.
void AllAtOnce(int threads, const std::function<void(int)>& body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      ++ready;
      while (ready.load() < threads) std::this_thread::yield();
      body(t);
    });
  }
  for (std::thread& thread : running) thread.join();
}

// Api replicas are processes with connections of their own: creators on two stores at once
// never pass a quota between them.
TEST_P(MetadataStoreTest, ConcurrentCreatorsOnTwoStoresNeverPassAQuota) {
  std::unique_ptr<MetadataStore> other = OpenDb(spec_);  // another process, as far as the database knows
  ASSERT_NE(other, nullptr);
  constexpr int kThreads = 8;  // half on each store
  constexpr int kAttempts = 3;
  const int64_t now = absl::ToUnixMillis(absl::Now());
  for (int round = 0; round < 5; ++round) {
    for (const bool per_minute : {false, true}) {
      const std::string tenant = absl::StrCat(per_minute ? "minute-" : "active-", round);
      const JobQuota quota = per_minute ? Quota(0, 5, now) : Quota(3, 0, now);
      const int limit = per_minute ? 5 : 3;
      std::atomic<int> stored{0}, refused{0};
      AllAtOnce(kThreads, [&](int t) {
        MetadataStore& store = t % 2 == 0 ? *db_ : *other;
        for (int i = 0; i < kAttempts; ++i) {
          absl::StatusOr<v1::Job> job = CreateWithin(store, absl::StrCat(tenant, "-", t, "-", i), quota, "", tenant);
          if (job.ok()) {
            ++stored;
          } else if (absl::IsResourceExhausted(job.status())) {
            ++refused;
          } else {
            ADD_FAILURE() << job.status();
          }
        }
      });
      EXPECT_EQ(stored.load(), limit) << tenant;
      EXPECT_EQ(refused.load(), kThreads * kAttempts - limit) << tenant;
      EXPECT_EQ(db_->ListJobs(tenant, {}, 0, "")->jobs.size(), static_cast<size_t>(limit)) << tenant;
    }
  }
}

// ------------------------------------------------------------------ deletion, retention

TEST_P(MetadataStoreTest, UsageCountsModelsAndResultsApart) {
  ASSERT_TRUE(db_->PutModel(MakeModel("sha256:a", "", "t")).ok());  // 42 bytes
  ASSERT_TRUE(db_->PutModel(MakeModel("sha256:b", "", "t")).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("s", v1::SUCCEEDED), nullptr).ok());
  ASSERT_TRUE(db_->PutResult("s", v1::MODEL, ResultRef{"ab", 100}).ok());
  ASSERT_TRUE(db_->PutResult("s", v1::REPORT, ResultRef{"cd", 5}).ok());
  const TenantUsage usage = *db_->Usage("t");
  EXPECT_EQ(usage.models, 2);
  EXPECT_EQ(usage.model_bytes, 84);
  EXPECT_EQ(usage.results, 2);
  EXPECT_EQ(usage.result_bytes, 105);
  EXPECT_EQ(usage.stored_bytes, 189);
  EXPECT_EQ(db_->Usage("u")->models, 0);
}

TEST_P(MetadataStoreTest, DeleteJobTakesAnEndedJobWithItsShardsEventsAndResultsAndRefusesOthers) {
  ShardedJob sharded = MakeSharded("p", 2);
  ASSERT_TRUE(Create(*db_, sharded).ok());
  for (const char* id : {"p", "p-0", "p-1"}) {
    v1::Job job = *db_->GetJob(id);
    job.set_state(v1::SUCCEEDED);
    ASSERT_TRUE(db_->CommitJob(job, {StateEvent(v1::SUCCEEDED)}, {{v1::MODEL, ResultRef{absl::StrCat(id, "-m"), 10}}})
                    .ok());
  }
  ASSERT_TRUE(db_->CreateJob(MakeJob("q", v1::QUEUED), nullptr).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("r", v1::RUNNING), nullptr).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("c", v1::CANCELLING), nullptr).ok());

  for (const char* active : {"q", "r", "c"}) {
    absl::StatusOr<std::vector<ResultRef>> refused = db_->DeleteJob(active);
    ASSERT_TRUE(absl::IsFailedPrecondition(refused.status())) << active << ": " << refused.status();
    EXPECT_NE(refused.status().message().find("cancel it first"), absl::string_view::npos) << refused.status();
  }
  EXPECT_TRUE(absl::IsFailedPrecondition(db_->DeleteJob("p-0").status()));  // a shard goes with its parent
  EXPECT_TRUE(absl::IsNotFound(db_->DeleteJob("nope").status()));

  absl::StatusOr<std::vector<ResultRef>> results = db_->DeleteJob("p");
  ASSERT_TRUE(results.ok()) << results.status();
  std::set<std::string> digests;
  for (const ResultRef& ref : *results) digests.insert(ref.sha256);
  EXPECT_EQ(digests, (std::set<std::string>{"p-m", "p-0-m", "p-1-m"}));
  for (const char* id : {"p", "p-0", "p-1"}) {
    EXPECT_TRUE(absl::IsNotFound(db_->GetJob(id).status())) << id;
    EXPECT_TRUE(absl::IsNotFound(db_->EventsAfter(id, 0, 0).status())) << id;
    EXPECT_TRUE(absl::IsNotFound(db_->GetResult(id, v1::MODEL).status())) << id;
  }
  EXPECT_FALSE(*db_->BlobReferenced("p-m"));
  EXPECT_EQ(db_->Usage("t")->results, 0);
  EXPECT_TRUE(absl::IsNotFound(db_->DeleteJob("p").status()));  // a second delete (another replica's)
  EXPECT_EQ(db_->JobsInStates({})->size(), 3u);
}

TEST_P(MetadataStoreTest, DeleteModelUnlessUsedKeepsAModelAQueuedOrRunningJobUses) {
  ASSERT_TRUE(db_->PutModel(MakeModel(DigestId("a"), "m")).ok());
  ASSERT_TRUE(db_->PutModel(MakeModel(DigestId("a"), "m", "u")).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("q", v1::QUEUED, "", DigestId("a")), nullptr).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("s", v1::SUCCEEDED, "", DigestId("a")), nullptr).ok());
  EXPECT_EQ(*db_->DeleteModelUnlessUsed("t", DigestId("a")), 1);
  EXPECT_TRUE(db_->GetModel("t", DigestId("a")).ok());
  // Another tenant's jobs do not hold this tenant's model, nor the other way round.
  EXPECT_EQ(*db_->DeleteModelUnlessUsed("u", DigestId("a")), 0);
  EXPECT_TRUE(absl::IsNotFound(db_->GetModel("u", DigestId("a")).status()));
  v1::Job job = *db_->GetJob("q");
  job.set_state(v1::FAILED);
  ASSERT_TRUE(db_->UpdateJob(job, StateEvent(v1::FAILED)).ok());
  EXPECT_EQ(*db_->DeleteModelUnlessUsed("t", DigestId("a")), 0);  // an ended job needs it no more
  EXPECT_TRUE(absl::IsNotFound(db_->GetModel("t", DigestId("a")).status()));
  EXPECT_TRUE(absl::IsNotFound(db_->DeleteModelUnlessUsed("t", DigestId("a")).status()));

  // Shards still stopping under a parent that has ended hold the model, as one job.
  ASSERT_TRUE(db_->PutModel(MakeModel(DigestId("b"), "m")).ok());
  ShardedJob sharded = MakeSharded("p", 2);
  sharded.parent.mutable_spec()->set_model_id(DigestId("b"));
  for (NewJob& child : sharded.children) child.job.mutable_spec()->set_model_id(DigestId("b"));
  ASSERT_TRUE(Create(*db_, sharded).ok());
  const auto set_state = [&](const std::string& id, v1::JobState state) {
    v1::Job stored = *db_->GetJob(id);
    stored.set_state(state);
    ASSERT_TRUE(db_->UpdateJob(stored, StateEvent(state)).ok());
  };
  set_state("p", v1::CANCELLED);
  set_state("p-0", v1::CANCELLING);
  set_state("p-1", v1::RUNNING);
  EXPECT_EQ(*db_->DeleteModelUnlessUsed("t", DigestId("b")), 1);
  set_state("p-0", v1::CANCELLED);
  set_state("p-1", v1::CANCELLED);
  EXPECT_EQ(*db_->DeleteModelUnlessUsed("t", DigestId("b")), 0);
}

TEST_P(MetadataStoreTest, AJobWhoseModelMustExistIsNotStoredWithoutIt) {
  JobQuota checked;
  checked.model_must_exist = true;
  bool created = false;
  absl::StatusOr<v1::Job> refused = db_->CreateJob(MakeJob("j", v1::QUEUED, "", DigestId("a")), &created, {}, {}, checked);
  EXPECT_TRUE(absl::IsNotFound(refused.status())) << refused.status();
  EXPECT_TRUE(absl::IsNotFound(db_->GetJob("j").status()));
  ASSERT_TRUE(db_->PutModel(MakeModel(DigestId("a"), "m", "u")).ok());  // another tenant's is not the job's
  EXPECT_TRUE(absl::IsNotFound(
      db_->CreateJob(MakeJob("j", v1::QUEUED, "", DigestId("a")), &created, {}, {}, checked).status()));
  ASSERT_TRUE(db_->PutModel(MakeModel(DigestId("a"), "m")).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("j", v1::QUEUED, "", DigestId("a")), &created, {}, {}, checked).ok());
  EXPECT_TRUE(created);
}

// A submission retried after its job ended and its model was deleted is answered with its job,
// not refused for the model: the request_id is looked up before anything else is checked.
TEST_P(MetadataStoreTest, ARetryIsAnsweredWithItsJobAfterItsModelIsGone) {
  ASSERT_TRUE(db_->PutModel(MakeModel(DigestId("a"), "m")).ok());
  JobQuota checked;
  checked.model_must_exist = true;
  bool created = false;
  ASSERT_TRUE(db_->CreateJob(MakeJob("j", v1::QUEUED, "key", DigestId("a")), &created, {}, {}, checked).ok());
  EXPECT_TRUE(created);
  SetState(*db_, "j", v1::SUCCEEDED);
  ASSERT_EQ(*db_->DeleteModelUnlessUsed("t", DigestId("a")), 0);
  for (const bool quota : {false, true}) {
    JobQuota retry = quota ? Quota(/*max_active_jobs=*/1, /*max_submissions_per_minute=*/1, kT0) : JobQuota();
    retry.model_must_exist = true;
    absl::StatusOr<v1::Job> again =
        db_->CreateJob(MakeJob("j-again", v1::QUEUED, "key", DigestId("a")), &created, {}, {}, retry);
    ASSERT_TRUE(again.ok()) << "quota " << quota << ": " << again.status();
    EXPECT_FALSE(created);
    EXPECT_EQ(again->id(), "j");
  }
  // A new request for the gone model is refused, and nothing of it stored.
  EXPECT_TRUE(absl::IsNotFound(
      db_->CreateJob(MakeJob("k", v1::QUEUED, "other", DigestId("a")), &created, {}, {}, checked).status()));
  EXPECT_TRUE(absl::IsNotFound(db_->GetJob("k").status()));
}

// The quotas are checked before the model: a tenant over its quota is told so whether or not
// the model it names is there.
TEST_P(MetadataStoreTest, ATenantOverItsQuotaIsToldSoBeforeAMissingModel) {
  JobQuota quota = Quota(/*max_active_jobs=*/1, 0, kT0);
  ASSERT_TRUE(CreateWithin(*db_, "a", quota).ok());
  quota.model_must_exist = true;
  bool created = false;
  absl::StatusOr<v1::Job> refused =
      db_->CreateJob(MakeJob("b", v1::QUEUED, "", DigestId("gone")), &created, {}, {}, quota);
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  // With room, the missing model is what is refused.
  SetState(*db_, "a", v1::FAILED);
  refused = db_->CreateJob(MakeJob("b", v1::QUEUED, "", DigestId("gone")), &created, {}, {}, quota);
  EXPECT_TRUE(absl::IsNotFound(refused.status())) << refused.status();
  EXPECT_TRUE(absl::IsNotFound(db_->GetJob("b").status()));
}

// Clients retrying one submission through several api replicas at once: one job is stored,
// and every attempt is answered with it, with quotas counted or not.
TEST_P(MetadataStoreTest, ConcurrentRetriesOfOneRequestOnTwoStoresStoreOneJob) {
  std::unique_ptr<MetadataStore> other = OpenDb(spec_);  // another process, as far as the database knows
  ASSERT_NE(other, nullptr);
  constexpr int kThreads = 8;  // half on each store
  for (int round = 0; round < 6; ++round) {
    const bool limited = round % 2 == 1;
    const JobQuota quota = limited ? Quota(/*max_active_jobs=*/1, 0, kT0) : JobQuota();
    const std::string tenant = absl::StrCat("tenant-", round);
    const std::string request_id = absl::StrCat("req-", round);
    std::atomic<int> stored{0};
    std::vector<std::string> answers(kThreads);
    AllAtOnce(kThreads, [&](int t) {
      MetadataStore& store = t % 2 == 0 ? *db_ : *other;
      bool created = false;
      absl::StatusOr<v1::Job> job =
          store.CreateJob(MakeJob(absl::StrCat(tenant, "-", t), v1::QUEUED, request_id, "sha256:m", tenant), &created,
                          {StateEvent(v1::QUEUED)}, {}, quota);
      if (!job.ok()) {
        ADD_FAILURE() << job.status();
        return;
      }
      if (created) ++stored;
      answers[t] = job->id();
    });
    EXPECT_EQ(stored.load(), 1) << tenant;
    const std::vector<v1::Job> jobs = db_->ListJobs(tenant, {}, 0, "")->jobs;
    ASSERT_EQ(jobs.size(), 1u) << tenant;
    for (const std::string& answer : answers) EXPECT_EQ(answer, jobs[0].id()) << tenant;
    EXPECT_EQ(db_->EventsAfter(jobs[0].id(), 0, 0)->size(), 1u) << tenant;
  }
}

// The retention sweeper's race: a sweep deleting a model version on one store while a job
// that uses it is created on another. Whichever transaction goes first, the outcome is one
// of two: the job is stored and its model stays, or the model is gone and no job was stored.
TEST_P(MetadataStoreTest, ASweepRacingASubmissionNeverLeavesAJobWithoutItsModel) {
  std::unique_ptr<MetadataStore> sweeper = OpenDb(spec_);
  ASSERT_NE(sweeper, nullptr);
  JobQuota checked;
  checked.model_must_exist = true;
  int jobs_won = 0, sweeps_won = 0;
  for (int i = 0; i < 40; ++i) {
    const std::string model = DigestId(absl::StrCat(i, "f"));
    const std::string job = absl::StrCat("j", i);
    ASSERT_TRUE(db_->PutModel(MakeModel(model, "raced")).ok());
    // Every third iteration the sweep starts a little late, every third the submission, and
    // in the rest they start together: both orders, and the overlap, each come up.
    const absl::Duration sweep_delay = i % 3 == 0 ? absl::Milliseconds(2) : absl::ZeroDuration();
    const absl::Duration submit_delay = i % 3 == 1 ? absl::Milliseconds(2) : absl::ZeroDuration();
    std::atomic<bool> go{false};
    absl::StatusOr<int64_t> swept = 0;
    std::thread sweep([&] {
      while (!go) std::this_thread::yield();
      absl::SleepFor(sweep_delay);
      swept = sweeper->DeleteModelUnlessUsed("t", model);
    });
    go = true;
    absl::SleepFor(submit_delay);
    absl::StatusOr<v1::Job> submitted = db_->CreateJob(MakeJob(job, v1::QUEUED, "", model), nullptr, {}, {}, checked);
    sweep.join();
    ASSERT_TRUE(swept.ok()) << swept.status();
    const bool model_stays = db_->GetModel("t", model).ok();
    if (submitted.ok()) {
      ++jobs_won;
      EXPECT_TRUE(model_stays) << "iteration " << i << ": job " << job << " was stored, its model deleted";
      EXPECT_EQ(*swept, 1) << i;
    } else {
      ++sweeps_won;
      EXPECT_TRUE(absl::IsNotFound(submitted.status())) << submitted.status();
      EXPECT_FALSE(model_stays) << i;
      EXPECT_TRUE(absl::IsNotFound(db_->GetJob(job).status())) << i;
    }
  }
  EXPECT_GT(jobs_won, 0);
  EXPECT_GT(sweeps_won, 0);
}

// ------------------------------------------------------------------------------- plans

// Plan bytes as server/jobs makes them: a serialized message, so any byte, NUL and 0xff too.
std::string PlanBytes(const std::string& tag) { return absl::StrCat(tag, std::string("\0\xff\x01\0", 4), tag); }

TEST_P(MetadataStoreTest, AJobsPlanIsStoredWithItAndReadBackByteForByte) {
  const std::string plan = PlanBytes("plan");
  ASSERT_EQ(plan.size(), 12u);
  bool created = false;
  ASSERT_TRUE(db_->CreateJob(MakeJob("j", v1::QUEUED, "req"), &created, {StateEvent(v1::QUEUED)}, {}, {}, plan).ok());
  EXPECT_TRUE(created);
  absl::StatusOr<std::string> stored = db_->JobPlan("j");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(*stored, plan);
  // Writes to the job leave its plan as it is, and it survives a reopen.
  v1::Job job = *db_->GetJob("j");
  job.set_state(v1::RUNNING);
  ASSERT_TRUE(db_->UpdateJob(job, StateEvent(v1::RUNNING)).ok());
  db_.reset();
  db_ = OpenDb(spec_);
  ASSERT_NE(db_, nullptr);
  EXPECT_EQ(*db_->JobPlan("j"), plan);
}

TEST_P(MetadataStoreTest, EachShardIsStoredWithItsOwnPlan) {
  ShardedJob sharded = MakeSharded("p", 3, "req", {2, 0, 1});
  for (NewJob& child : sharded.children) child.plan = PlanBytes(child.job.id());
  ASSERT_TRUE(db_->CreateJob(sharded.parent, nullptr, sharded.events, sharded.children, {}, PlanBytes("p")).ok());
  EXPECT_EQ(*db_->JobPlan("p"), PlanBytes("p"));
  for (const char* shard : {"p-0", "p-1", "p-2"}) EXPECT_EQ(*db_->JobPlan(shard), PlanBytes(shard)) << shard;
}

TEST_P(MetadataStoreTest, ARetryWithAnotherPlanLeavesTheFirstPlan) {
  bool created = false;
  ShardedJob first = MakeSharded("p", 2, "req");
  for (NewJob& child : first.children) child.plan = PlanBytes("first");
  ASSERT_TRUE(db_->CreateJob(first.parent, &created, first.events, first.children, {}, PlanBytes("first")).ok());
  ASSERT_TRUE(created);
  ShardedJob retry = MakeSharded("p", 2, "req");
  for (NewJob& child : retry.children) child.plan = PlanBytes("second");
  absl::StatusOr<v1::Job> again =
      db_->CreateJob(retry.parent, &created, retry.events, retry.children, {}, PlanBytes("second"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(created);
  for (const char* id : {"p", "p-0", "p-1"}) EXPECT_EQ(*db_->JobPlan(id), PlanBytes("first")) << id;
  // A retry under another job id (each attempt names its own) stores no row to hold a plan.
  ASSERT_TRUE(db_->CreateJob(MakeJob("j", v1::QUEUED, "key"), &created, {}, {}, {}, PlanBytes("first")).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("j-retry", v1::QUEUED, "key"), &created, {}, {}, {}, PlanBytes("second")).ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(*db_->JobPlan("j"), PlanBytes("first"));
  EXPECT_TRUE(absl::IsNotFound(db_->JobPlan("j-retry").status()));
}

TEST_P(MetadataStoreTest, JobPlanOfAnUnknownJobIsNotFound) {
  ASSERT_TRUE(db_->CreateJob(MakeJob("j", v1::QUEUED), nullptr, {}, {}, {}, PlanBytes("plan")).ok());
  const absl::StatusOr<std::string> plan = db_->JobPlan("nope");
  ASSERT_TRUE(absl::IsNotFound(plan.status())) << plan.status();
  EXPECT_EQ(plan.status().message(), "no job 'nope'");
  EXPECT_TRUE(absl::IsNotFound(db_->JobPlan("").status()));
}

TEST_P(MetadataStoreTest, AJobStoredWithoutAPlanReadsAnEmptyOne) {
  ASSERT_TRUE(db_->CreateJob(MakeJob("default", v1::QUEUED), nullptr).ok());
  ASSERT_TRUE(db_->CreateJob(MakeJob("empty", v1::QUEUED), nullptr, {}, {}, {}, "").ok());
  ASSERT_TRUE(Create(*db_, MakeSharded("p", 2)).ok());  // shards with NewJob's default plan
  for (const char* id : {"default", "empty", "p", "p-0", "p-1"}) {
    absl::StatusOr<std::string> plan = db_->JobPlan(id);
    ASSERT_TRUE(plan.ok()) << id << ": " << plan.status();
    EXPECT_EQ(*plan, "") << id;
  }
}

TEST_P(MetadataStoreTest, DeletingAJobDeletesItsPlanAndItsShardsPlans) {
  ShardedJob sharded = MakeSharded("p", 2);
  for (NewJob& child : sharded.children) child.plan = PlanBytes("shard");
  ASSERT_TRUE(db_->CreateJob(sharded.parent, nullptr, sharded.events, sharded.children, {}, PlanBytes("p")).ok());
  for (const char* id : {"p", "p-0", "p-1"}) {
    v1::Job job = *db_->GetJob(id);
    job.set_state(v1::SUCCEEDED);
    ASSERT_TRUE(db_->CommitJob(job, {StateEvent(v1::SUCCEEDED)}).ok()) << id;
  }
  ASSERT_TRUE(db_->DeleteJob("p").ok());
  for (const char* id : {"p", "p-0", "p-1"}) EXPECT_TRUE(absl::IsNotFound(db_->JobPlan(id).status())) << id;
  // The id is free again, and a job stored under it has its own plan, not the deleted one's.
  ASSERT_TRUE(db_->CreateJob(MakeJob("p", v1::QUEUED), nullptr).ok());
  EXPECT_EQ(*db_->JobPlan("p"), "");
}

// CountQueue with every worker heard from since the epoch and no lease counted as live.
QueueCounts CountQueue(MetadataStore& db, const std::string& id) {
  absl::StatusOr<QueueCounts> counts = db.CountQueue(id, 0, absl::ToUnixMillis(absl::Now()));
  EXPECT_TRUE(counts.ok()) << id << ": " << counts.status();
  return counts.ok() ? *counts : QueueCounts{-1, -1, -1, -1};
}

TEST_P(MetadataStoreTest, JobsAheadAreTheQueuedJobsOfEveryTenantWithAHigherPriorityOrOlder) {
  bool created = false;
  for (const v1::Job& job : {Prioritised("old", 0, "a"), Prioritised("theirs", 0, "b"), Prioritised("mine", 0, "a"),
                             Prioritised("urgent", 5, "b"), Prioritised("later", 0, "b"),
                             Prioritised("low", -1, "a")}) {
    ASSERT_TRUE(db_->CreateJob(job, &created).ok());
  }
  EXPECT_EQ(CountQueue(*db_, "urgent").jobs_ahead, 0);
  EXPECT_EQ(CountQueue(*db_, "old").jobs_ahead, 1);     // urgent
  EXPECT_EQ(CountQueue(*db_, "mine").jobs_ahead, 3);    // urgent, old, theirs
  EXPECT_EQ(CountQueue(*db_, "later").jobs_ahead, 4);
  EXPECT_EQ(CountQueue(*db_, "low").jobs_ahead, 5);
  // A claimed job is not ahead any more: it runs.
  EXPECT_EQ(NextRun(*db_, nullptr), "urgent");
  EXPECT_EQ(CountQueue(*db_, "mine").jobs_ahead, 2);
  EXPECT_TRUE(absl::IsNotFound(db_->CountQueue("nothing", 0, 0).status()));
}

TEST_P(MetadataStoreTest, RunningCountsAreTheJobsHoldingAWorkerOfTheTenantAndOfAll) {
  bool created = false;
  for (const v1::Job& job : {Prioritised("a0", 0, "a"), Prioritised("a1", 0, "a"), Prioritised("b0", 0, "b"),
                             Prioritised("a-waits", 0, "a"), Prioritised("b-waits", 0, "b")}) {
    ASSERT_TRUE(db_->CreateJob(job, &created).ok());
  }
  EXPECT_EQ(CountQueue(*db_, "a-waits").tenant_running, 0);
  EXPECT_EQ(CountQueue(*db_, "a-waits").jobs_running, 0);
  for (const char* id : {"a0", "b0", "a1"}) EXPECT_EQ(NextRun(*db_, nullptr), id);  // turns between tenants
  MoveTo(*db_, "a1", v1::CANCELLING);  // still holds its worker until its run stops
  QueueCounts a = CountQueue(*db_, "a-waits");
  EXPECT_EQ(a.tenant_running, 2);
  EXPECT_EQ(a.jobs_running, 3);
  EXPECT_EQ(CountQueue(*db_, "b-waits").tenant_running, 1);
  MoveTo(*db_, "a0", v1::SUCCEEDED);
  MoveTo(*db_, "a1", v1::CANCELLED);
  a = CountQueue(*db_, "a-waits");
  EXPECT_EQ(a.tenant_running, 0);
  EXPECT_EQ(a.jobs_running, 1);
}

TEST_P(MetadataStoreTest, ShardsQueueAmongRunJobsAndAShardedJobAmongShardedJobs) {
  bool created = false;
  ASSERT_TRUE(Create(*db_, MakeSharded("p", 3), &created).ok());
  ASSERT_TRUE(db_->CreateJob(Prioritised("plain", 0, "t"), &created).ok());
  ASSERT_TRUE(Create(*db_, MakeSharded("q", 2), &created).ok());
  EXPECT_EQ(CountQueue(*db_, "plain").jobs_ahead, 3);  // p's shards, not p
  EXPECT_EQ(CountQueue(*db_, "p-2").jobs_ahead, 2);
  EXPECT_EQ(CountQueue(*db_, "q-0").jobs_ahead, 4);
  EXPECT_EQ(CountQueue(*db_, "p").jobs_ahead, 0);
  EXPECT_EQ(CountQueue(*db_, "q").jobs_ahead, 1);  // p, waiting for a coordinator too
  // A coordinated parent holds no worker; its shards do.
  ASSERT_TRUE(db_->ClaimJob("c", absl::ToUnixMillis(absl::Now()) + 60000, ToRunning("coordinator"),
                            ClaimKind::kCoordinate)
                  ->has_value());
  EXPECT_EQ(CountQueue(*db_, "q").jobs_ahead, 0);
  EXPECT_EQ(CountQueue(*db_, "plain").tenant_running, 0);
  EXPECT_EQ(NextRun(*db_, nullptr), "p-0");
  EXPECT_EQ(CountQueue(*db_, "plain").tenant_running, 1);
  EXPECT_EQ(CountQueue(*db_, "plain").jobs_running, 1);
}

TEST_P(MetadataStoreTest, WorkersHeardAreOwnersOfLiveEndpointsOrLiveLeasesEachOnce) {
  bool created = false;
  for (const char* id : {"j0", "j1", "j2", "waits"}) {
    ASSERT_TRUE(db_->CreateJob(MakeJob(id, v1::QUEUED), &created).ok());
  }
  const int64_t now = absl::ToUnixMillis(absl::Now());
  const int64_t heard_since = now - 35000;
  const auto heard = [&] { return db_->CountQueue("waits", heard_since, now)->workers_heard; };
  EXPECT_EQ(heard(), 0);
  ASSERT_TRUE(db_->PutWorkerEndpoint("w-gone", "10.0.0.1:1", now - 60000).ok());
  EXPECT_EQ(heard(), 0);
  ASSERT_TRUE(db_->PutWorkerEndpoint("w-up", "10.0.0.2:1", now - 1000).ok());
  EXPECT_EQ(heard(), 1);
  // Its own lease does not make it two; another process's live lease is one more, an
  // expired one none.
  ASSERT_TRUE(db_->ClaimJob("w-up", now + 60000, ToRunning("cpu"))->has_value());
  EXPECT_EQ(heard(), 1);
  ASSERT_TRUE(db_->ClaimJob("w-no-endpoint", now + 60000, ToRunning("cpu"))->has_value());
  EXPECT_EQ(heard(), 2);
  ASSERT_TRUE(db_->ClaimJob("w-dead", now - 1, ToRunning("cpu"))->has_value());
  EXPECT_EQ(heard(), 2);
}

// ------------------------------------------------------------------------ reservations

// The key of an upload of the model DigestId(hex) (what PutModel converts).
std::string UploadKey(const std::string& hex) { return UploadReservationKey(DigestId(hex).substr(7)); }

TEST_P(MetadataStoreTest, AReservationCountsUntilPutModelTurnsItIntoTheModelInOneTransaction) {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  ASSERT_TRUE(db_->Reserve({"t", UploadKey("a"), 42}, 0, now)->granted);
  ASSERT_TRUE(db_->Reserve({"u", UploadKey("a"), 42}, 0, now)->granted);  // another tenant's, kept
  TenantUsage usage = *db_->Usage("t");
  EXPECT_EQ(usage.reservations, 1);
  EXPECT_EQ(usage.reserved_bytes, 42);
  EXPECT_EQ(usage.stored_bytes, 42);
  ASSERT_TRUE(db_->PutModel(MakeModel(DigestId("a"), "m")).ok());  // 42 bytes
  usage = *db_->Usage("t");
  EXPECT_EQ(usage.reserved_bytes, 0);
  EXPECT_EQ(usage.model_bytes, 42);
  EXPECT_EQ(usage.stored_bytes, 42);
  EXPECT_EQ(db_->Usage("u")->reserved_bytes, 42);
  // The tenant has the bytes already: the stored model stays, and the reservation goes too.
  ASSERT_TRUE(db_->Reserve({"t", UploadKey("a"), 42}, 0, now)->granted);
  ASSERT_TRUE(db_->PutModel(MakeModel(DigestId("a"), "other")).ok());
  EXPECT_EQ(db_->Usage("t")->stored_bytes, 42);
}

TEST_P(MetadataStoreTest, AReservationIsRefusedPastTheLimitAndAKeysOwnBytesAreNotCountedTwice) {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  ASSERT_TRUE(db_->PutModel(MakeModel(DigestId("a"), "m")).ok());  // 42 of 100
  absl::StatusOr<ReserveOutcome> first = db_->Reserve({"t", UploadKey("b"), 50}, 100, now);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->granted);
  EXPECT_EQ(first->usage_before.stored_bytes, 42);
  // 42 + 50 + 9 > 100: refused, and what the tenant holds is told as it was counted.
  absl::StatusOr<ReserveOutcome> refused = db_->Reserve({"t", UploadKey("c"), 9}, 100, now);
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_FALSE(refused->granted);
  EXPECT_EQ(refused->usage_before.model_bytes, 42);
  EXPECT_EQ(refused->usage_before.reserved_bytes, 50);
  EXPECT_EQ(db_->Usage("t")->reservations, 1);
  // Taken again under its own key (a resumed upload), a reservation replaces what it held.
  EXPECT_TRUE(db_->Reserve({"t", UploadKey("b"), 58}, 100, now)->granted);
  EXPECT_FALSE(db_->Reserve({"t", UploadKey("b"), 59}, 100, now)->granted);
  EXPECT_EQ(db_->Usage("t")->reserved_bytes, 58);  // the refused one changed nothing
  EXPECT_TRUE(db_->Reserve({"t", UploadKey("b"), 59}, 0, now)->granted);  // no limit
  EXPECT_TRUE(absl::IsInvalidArgument(db_->Reserve({"", UploadKey("b"), 1}, 0, now).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(db_->Reserve({"t", "", 1}, 0, now).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(db_->Reserve({"t", UploadKey("b"), -1}, 0, now).status()));
}

TEST_P(MetadataStoreTest, AJobsResultsReservationGoesWithTheWriteThatStoresThemOrEndsTheRun) {
  const int64_t now = absl::ToUnixMillis(absl::Now());
  for (const char* id : {"done", "requeued", "failed"}) {
    ASSERT_TRUE(db_->CreateJob(MakeJob(id, v1::RUNNING), nullptr).ok());
    ASSERT_TRUE(db_->Reserve({"t", ResultsReservationKey(id), 100}, 0, now)->granted);
  }
  v1::Job job = *db_->GetJob("done");
  job.set_attempts(2);  // still RUNNING: the reservation stays
  ASSERT_TRUE(db_->CommitJob(job, {}).ok());
  EXPECT_EQ(db_->Usage("t")->reserved_bytes, 300);
  job.set_state(v1::SUCCEEDED);
  ASSERT_TRUE(db_->CommitJob(job, {StateEvent(v1::SUCCEEDED)}, {{v1::MODEL, ResultRef{"ab", 100}}}).ok());
  TenantUsage usage = *db_->Usage("t");
  EXPECT_EQ(usage.result_bytes, 100);
  EXPECT_EQ(usage.reserved_bytes, 200);
  EXPECT_EQ(usage.stored_bytes, 300);
  job = *db_->GetJob("requeued");
  job.set_state(v1::QUEUED);  // its worker died: the reaper puts it back, its next run reserves again
  ASSERT_TRUE(db_->CommitJob(job, {StateEvent(v1::QUEUED)}).ok());
  job = *db_->GetJob("failed");
  job.set_state(v1::FAILED);
  ASSERT_TRUE(db_->UpdateJob(job, StateEvent(v1::FAILED)).ok());
  usage = *db_->Usage("t");
  EXPECT_EQ(usage.reservations, 0);
  EXPECT_EQ(usage.stored_bytes, 100);
}

TEST_P(MetadataStoreTest, ReservationsAreTouchedAtMostOnceAMinuteReleasedAndExpiredWhenIdle) {
  const int64_t t0 = absl::ToUnixMillis(absl::Now());
  const int64_t minute = absl::ToInt64Milliseconds(kReservationTouchEvery);
  for (const char* key : {"idle", "lazy", "busy", "released"}) ASSERT_TRUE(db_->Reserve({"t", key, 1}, 0, t0)->granted);
  EXPECT_TRUE(*db_->TouchReservation("t", "lazy", t0 + minute / 2));  // fresh enough: held, not written
  EXPECT_TRUE(*db_->TouchReservation("t", "busy", t0 + minute));      // due: written
  EXPECT_FALSE(*db_->TouchReservation("t", "nobody's", t0 + minute));
  EXPECT_FALSE(*db_->TouchReservation("u", "busy", t0 + minute)) << "another tenant's key is not this one";
  ASSERT_TRUE(db_->ReleaseReservation("t", "released").ok());
  ASSERT_TRUE(db_->ReleaseReservation("t", "released").ok());  // twice: OK
  EXPECT_EQ(*db_->ExpireReservations(t0), 0);                   // touched before t0: none
  EXPECT_EQ(*db_->ExpireReservations(t0 + 1), 2);               // "idle" and "lazy"
  const TenantUsage usage = *db_->Usage("t");
  EXPECT_EQ(usage.reservations, 1);
  EXPECT_EQ(usage.reserved_bytes, 1);
  EXPECT_EQ(*db_->ExpireReservations(t0 + minute), 0);
  EXPECT_EQ(*db_->ExpireReservations(t0 + minute + 1), 1);
  EXPECT_EQ(db_->Usage("t")->reservations, 0);
}

// Api replicas racing for a tenant's last bytes, each on its own connection: exactly as many
// reservations as fit are granted, whatever the interleaving, and the sum never passes.
TEST_P(MetadataStoreTest, ConcurrentReserversOnTwoStoresNeverPassTheLimit) {
  std::unique_ptr<MetadataStore> other = OpenDb(spec_);  // another process, as far as the database knows
  ASSERT_NE(other, nullptr);
  constexpr int kThreads = 8;  // half on each store
  constexpr int kAttempts = 4;
  const int64_t now = absl::ToUnixMillis(absl::Now());
  for (int round = 0; round < 5; ++round) {
    const std::string tenant = absl::StrCat("racer-", round);
    ASSERT_TRUE(db_->PutModel(MakeModel(DigestId("a"), "m", tenant)).ok());  // 42 bytes
    constexpr int64_t kLimit = 42 + 7 * 10;                                  // room for 7 of 10 bytes
    std::atomic<int> granted{0};
    AllAtOnce(kThreads, [&](int t) {
      MetadataStore& store = t % 2 == 0 ? *db_ : *other;
      for (int i = 0; i < kAttempts; ++i) {
        absl::StatusOr<ReserveOutcome> outcome = store.Reserve({tenant, absl::StrCat("k", t, "-", i), 10}, kLimit, now);
        ASSERT_TRUE(outcome.ok()) << outcome.status();
        if (outcome->granted) ++granted;
        EXPECT_LE(outcome->usage_before.stored_bytes, kLimit);
      }
    });
    EXPECT_EQ(granted.load(), 7) << tenant;
    EXPECT_EQ(db_->Usage(tenant)->stored_bytes, kLimit) << tenant;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, MetadataStoreTest, ::testing::Values("sqlite", "postgresql"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace recal::store
