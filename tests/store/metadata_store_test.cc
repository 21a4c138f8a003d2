// The MetadataStore conformance suite: what every backend must do alike, on SQLite and on
// PostgreSQL (a throwaway server per test binary; tests skip, saying why, without one).
#include "server/store/metadata_store.h"

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/store/metadata_test_util.h"
#include "tests/store/postgres_server.h"
#include "tests/test_util.h"

namespace recal::store {
namespace {

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
  EXPECT_EQ(db_->ListModels("t", 0, "")->models.size(), 1u);
  EXPECT_EQ(db_->ListModels("", 0, "")->models.size(), 2u);
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
  EXPECT_EQ(db_->ListModels("", 0, "")->models.size(), 1u);
  EXPECT_TRUE(absl::IsNotFound(db_->GetModel("t", "sha256:b").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(db_->PutModel(v1::Model()).status()));
}

TEST_P(MetadataStoreTest, ModelPaginationAndDelete) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(db_->PutModel(MakeModel(absl::StrCat("m", i), "")).ok());
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    absl::StatusOr<ModelPage> page = db_->ListModels("", 2, token);
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
  EXPECT_EQ(db_->ListModels("", 100, "")->models.size(), 4u);
}

TEST_P(MetadataStoreTest, GarbagePageTokensAreInvalidArgument) {
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(db_->PutModel(MakeModel(absl::StrCat("m", i), "")).ok());
    ASSERT_TRUE(db_->CreateJob(MakeJob(absl::StrCat("j", i), v1::QUEUED), nullptr).ok());
  }
  const std::string jobs_token = db_->ListJobs("", {}, 1, "")->next_page_token;
  const std::string models_token = db_->ListModels("", 1, "")->next_page_token;
  ASSERT_FALSE(jobs_token.empty());
  for (const std::string& bad : {std::string("garbage"), std::string("!!"), std::string("0"), models_token}) {
    EXPECT_TRUE(absl::IsInvalidArgument(db_->ListJobs("", {}, 1, bad).status())) << bad;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(db_->ListModels("", 1, jobs_token).status()));
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

INSTANTIATE_TEST_SUITE_P(Backends, MetadataStoreTest, ::testing::Values("sqlite", "postgresql"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace recal::store
