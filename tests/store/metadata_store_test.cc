#include "server/store/metadata_store.h"

#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace recal::store {
namespace {

using ::recal::testing::TempDir;

std::unique_ptr<MetadataStore> OpenDb(const std::string& path) {
  absl::StatusOr<std::unique_ptr<MetadataStore>> db = OpenMetadataStore(path);
  EXPECT_TRUE(db.ok()) << db.status();
  return db.ok() ? std::move(*db) : nullptr;
}

v1::Model MakeModel(const std::string& id, const std::string& name, const std::string& tenant = "t") {
  v1::Model m;
  m.set_id(id);
  m.set_tenant(tenant);
  m.set_name(name);
  m.set_size(42);
  return m;
}

v1::Job MakeJob(const std::string& id, v1::JobState state, const std::string& request_id = "",
                const std::string& model_id = "sha256:m", const std::string& tenant = "t") {
  v1::Job j;
  j.set_id(id);
  j.set_tenant(tenant);
  j.set_request_id(request_id);
  j.set_state(state);
  j.mutable_spec()->set_model_id(model_id);
  return j;
}

v1::JobEvent StateEvent(v1::JobState s) {
  v1::JobEvent e;
  e.set_state(s);
  return e;
}

std::vector<std::string> Ids(const std::vector<v1::Job>& jobs) {
  std::vector<std::string> ids;
  for (const auto& j : jobs) ids.push_back(j.id());
  return ids;
}

TEST(MetadataStoreTest, TenantsKeepTheirOwnModelsJobsAndRequestIds) {
  TempDir dir;
  auto db = OpenDb(dir.File("meta.db"));
  ASSERT_TRUE(db->PutModel(MakeModel("sha256:a", "mine", "t")).ok());
  ASSERT_TRUE(db->PutModel(MakeModel("sha256:a", "theirs", "u")).ok());
  EXPECT_EQ(db->GetModel("t", "sha256:a")->name(), "mine");
  EXPECT_EQ(db->GetModel("u", "sha256:a")->name(), "theirs");
  EXPECT_TRUE(absl::IsNotFound(db->GetModel("v", "sha256:a").status()));
  EXPECT_EQ(db->ListModels("t", 0, "")->models.size(), 1u);
  EXPECT_EQ(db->ListModels("", 0, "")->models.size(), 2u);
  ASSERT_TRUE(db->DeleteModel("t", "sha256:a").ok());
  EXPECT_TRUE(*db->ModelStoredByAnyTenant("sha256:a"));
  ASSERT_TRUE(db->DeleteModel("u", "sha256:a").ok());
  EXPECT_FALSE(*db->ModelStoredByAnyTenant("sha256:a"));

  // The same request_id in two tenants is two jobs: one tenant's key never finds another's job.
  bool created = false;
  ASSERT_TRUE(db->CreateJob(MakeJob("j1", v1::QUEUED, "key", "sha256:m", "t"), &created).ok());
  EXPECT_TRUE(created);
  auto other = db->CreateJob(MakeJob("j2", v1::QUEUED, "key", "sha256:m", "u"), &created);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(created);
  EXPECT_EQ(other->id(), "j2");
  EXPECT_EQ(db->CreateJob(MakeJob("j3", v1::QUEUED, "key", "sha256:m", "u"), &created)->id(), "j2");
  EXPECT_FALSE(created);
  EXPECT_EQ(db->FindJobByRequestId("t", "key")->id(), "j1");
  EXPECT_TRUE(absl::IsNotFound(db->FindJobByRequestId("v", "key").status()));
  EXPECT_EQ(Ids(db->ListJobs("u", {}, 0, "")->jobs), std::vector<std::string>{"j2"});
  EXPECT_EQ(db->ListJobs("", {}, 0, "")->jobs.size(), 2u);
  EXPECT_TRUE(absl::IsInvalidArgument(db->CreateJob(MakeJob("j4", v1::QUEUED, "", "sha256:m", ""), &created).status()));
}

TEST(MetadataStoreTest, UsageCountsActiveJobsAndStoredBytesPerTenant) {
  TempDir dir;
  auto db = OpenDb(dir.File("meta.db"));
  ASSERT_TRUE(db->PutModel(MakeModel("sha256:a", "", "t")).ok());  // 42 bytes
  bool created = false;
  ASSERT_TRUE(db->CreateJob(MakeJob("q", v1::QUEUED), &created).ok());
  ASSERT_TRUE(db->CreateJob(MakeJob("r", v1::RUNNING), &created).ok());
  ASSERT_TRUE(db->CreateJob(MakeJob("s", v1::SUCCEEDED), &created).ok());
  ASSERT_TRUE(db->CreateJob(MakeJob("o", v1::QUEUED, "", "sha256:m", "u"), &created).ok());
  ASSERT_TRUE(db->PutResult("s", v1::MODEL, ResultRef{"ab", 100}).ok());
  ASSERT_TRUE(db->PutResult("o", v1::MODEL, ResultRef{"cd", 1000}).ok());
  const TenantUsage usage = *db->Usage("t");
  EXPECT_EQ(usage.active_jobs, 2);
  EXPECT_EQ(usage.stored_bytes, 142);
  EXPECT_EQ(db->Usage("nobody")->stored_bytes, 0);
}

TEST(MetadataStoreTest, ADatabaseFromBeforeTenantsBecomesTheDefaultTenants) {
  TempDir dir;
  const std::string path = dir.File("meta.db");
  {
    // Schema version 1 as the previous release made it, with one model and one job.
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
    v1::Model model = MakeModel("sha256:a", "old", "");
    v1::Job job = MakeJob("old-job", v1::SUCCEEDED, "key", "sha256:a", "");
    const std::string sql = absl::StrCat(
        "CREATE TABLE models (id TEXT PRIMARY KEY, create_seq INTEGER NOT NULL UNIQUE, proto BLOB NOT NULL);"
        "CREATE TABLE jobs (id TEXT PRIMARY KEY, request_id TEXT UNIQUE, state INTEGER NOT NULL, "
        "model_id TEXT NOT NULL, create_seq INTEGER NOT NULL UNIQUE, proto BLOB NOT NULL);"
        "CREATE INDEX jobs_by_state ON jobs(state, create_seq); CREATE INDEX jobs_by_model ON jobs(model_id, state);"
        "CREATE TABLE events (job_id TEXT NOT NULL, seq INTEGER NOT NULL, proto BLOB NOT NULL, "
        "PRIMARY KEY (job_id, seq)) WITHOUT ROWID;"
        "CREATE TABLE results (job_id TEXT NOT NULL, artifact INTEGER NOT NULL, sha256 TEXT NOT NULL, "
        "size INTEGER NOT NULL, PRIMARY KEY (job_id, artifact)) WITHOUT ROWID;"
        "CREATE INDEX results_by_blob ON results(sha256);"
        "INSERT INTO models VALUES('sha256:a', 1, x'", absl::BytesToHexString(model.SerializeAsString()), "');"
        "INSERT INTO jobs VALUES('old-job', 'key', ", int{v1::SUCCEEDED}, ", 'sha256:a', 1, x'",
        absl::BytesToHexString(job.SerializeAsString()), "');"
        "INSERT INTO results VALUES('old-job', ", int{v1::MODEL}, ", 'ef', 7);"
        "PRAGMA user_version = 1;");
    ASSERT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
    sqlite3_close(raw);
  }
  auto db = OpenDb(path);
  ASSERT_NE(db, nullptr);
  auto model = db->GetModel(kDefaultTenant, "sha256:a");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->name(), "old");
  EXPECT_EQ(model->tenant(), kDefaultTenant);
  EXPECT_EQ(db->GetJob("old-job")->tenant(), kDefaultTenant);
  EXPECT_EQ(db->FindJobByRequestId(kDefaultTenant, "key")->id(), "old-job");
  EXPECT_EQ(db->GetResult("old-job", v1::MODEL)->size, 7);
  EXPECT_EQ(db->Usage(kDefaultTenant)->stored_bytes, 42 + 7);
  bool created = false;
  ASSERT_TRUE(db->CreateJob(MakeJob("new-job", v1::QUEUED, "", "sha256:a", kDefaultTenant), &created).ok());
  EXPECT_EQ(Ids(db->ListJobs("", {}, 0, "")->jobs), (std::vector<std::string>{"new-job", "old-job"}));
}

TEST(MetadataStoreTest, ModelPutTwiceIsOneModel) {
  TempDir dir;
  auto db = OpenDb(dir.File("meta.db"));
  ASSERT_EQ(db->PutModel(MakeModel("sha256:a", "first"))->name(), "first");
  // The same id again keeps what is stored.
  EXPECT_EQ(db->PutModel(MakeModel("sha256:a", "second"))->name(), "first");
  EXPECT_EQ(db->GetModel("t", "sha256:a")->name(), "first");
  EXPECT_EQ(db->ListModels("", 0, "")->models.size(), 1u);
  EXPECT_TRUE(absl::IsNotFound(db->GetModel("t", "sha256:b").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(db->PutModel(v1::Model()).status()));
}

TEST(MetadataStoreTest, ModelPaginationAndDelete) {
  TempDir dir;
  auto db = OpenDb(dir.File("meta.db"));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(db->PutModel(MakeModel(absl::StrCat("m", i), "")).ok());
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    absl::StatusOr<ModelPage> page = db->ListModels("", 2, token);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const auto& m : page->models) seen.push_back(m.id());
    token = page->next_page_token;
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, (std::vector<std::string>{"m4", "m3", "m2", "m1", "m0"}));  // newest first

  ASSERT_TRUE(db->DeleteModel("t", "m2").ok());
  EXPECT_TRUE(absl::IsNotFound(db->GetModel("t", "m2").status()));
  EXPECT_TRUE(absl::IsNotFound(db->DeleteModel("t", "m2")));
  EXPECT_EQ(db->ListModels("", 100, "")->models.size(), 4u);
}

TEST(MetadataStoreTest, GarbagePageTokensAreInvalidArgument) {
  TempDir dir;
  auto db = OpenDb(dir.File("meta.db"));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(db->PutModel(MakeModel(absl::StrCat("m", i), "")).ok());
    ASSERT_TRUE(db->CreateJob(MakeJob(absl::StrCat("j", i), v1::QUEUED), nullptr).ok());
  }
  const std::string jobs_token = db->ListJobs("", {}, 1, "")->next_page_token;
  const std::string models_token = db->ListModels("", 1, "")->next_page_token;
  ASSERT_FALSE(jobs_token.empty());
  for (const std::string& bad : {std::string("garbage"), std::string("!!"), std::string("0"), models_token}) {
    EXPECT_TRUE(absl::IsInvalidArgument(db->ListJobs("", {}, 1, bad).status())) << bad;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(db->ListModels("", 1, jobs_token).status()));
}

TEST(MetadataStoreTest, CreateJobIsIdempotentOnRequestId) {
  TempDir dir;
  auto db = OpenDb(dir.File("meta.db"));
  bool created = false;
  ASSERT_TRUE(db->CreateJob(MakeJob("j1", v1::QUEUED, "req-1"), &created).ok());
  EXPECT_TRUE(created);
  absl::StatusOr<v1::Job> again = db->CreateJob(MakeJob("j2", v1::QUEUED, "req-1"), &created);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(created);
  EXPECT_EQ(again->id(), "j1");
  EXPECT_TRUE(absl::IsNotFound(db->GetJob("j2").status()));

  // Jobs without a request_id never collide with each other.
  ASSERT_TRUE(db->CreateJob(MakeJob("j3", v1::QUEUED), &created).ok());
  EXPECT_TRUE(created);
  ASSERT_TRUE(db->CreateJob(MakeJob("j4", v1::QUEUED), &created).ok());
  EXPECT_TRUE(created);
  // A reused job id is a caller bug, reported as such.
  EXPECT_TRUE(absl::IsAlreadyExists(db->CreateJob(MakeJob("j4", v1::QUEUED), &created).status()));
  EXPECT_EQ(db->JobsInStates({})->size(), 3u);
}

TEST(MetadataStoreTest, UpdateJobAppendsEventsWithIncreasingSeq) {
  TempDir dir;
  auto db = OpenDb(dir.File("meta.db"));
  v1::Job job = MakeJob("j", v1::QUEUED);
  ASSERT_TRUE(db->CreateJob(job, nullptr).ok());
  ASSERT_EQ(db->EventsAfter("j", 0, 0)->size(), 0u);

  job.set_state(v1::RUNNING);
  absl::StatusOr<v1::JobEvent> e1 = db->UpdateJob(job, StateEvent(v1::RUNNING));
  ASSERT_TRUE(e1.ok()) << e1.status();
  EXPECT_EQ(e1->seq(), 1);
  EXPECT_GT(e1->time().seconds(), 1600000000);
  v1::JobEvent progress;
  progress.mutable_progress()->set_batches_done(3);
  EXPECT_EQ(db->AppendEvent("j", progress)->seq(), 2);
  job.set_state(v1::SUCCEEDED);
  EXPECT_EQ(db->UpdateJob(job, StateEvent(v1::SUCCEEDED))->seq(), 3);
  EXPECT_EQ(db->GetJob("j")->state(), v1::SUCCEEDED);

  std::vector<v1::JobEvent> after1 = *db->EventsAfter("j", 1, 0);
  ASSERT_EQ(after1.size(), 2u);
  EXPECT_EQ(after1[0].seq(), 2);
  EXPECT_EQ(after1[0].progress().batches_done(), 3);
  EXPECT_EQ(after1[1].state(), v1::SUCCEEDED);
  EXPECT_EQ(db->EventsAfter("j", 0, 2)->size(), 2u);  // limit
  EXPECT_EQ(db->EventsAfter("j", 3, 0)->size(), 0u);

  EXPECT_TRUE(
      absl::IsNotFound(db->UpdateJob(MakeJob("nope", v1::RUNNING), StateEvent(v1::RUNNING)).status()));
  EXPECT_TRUE(absl::IsNotFound(db->AppendEvent("nope", progress).status()));
  EXPECT_TRUE(absl::IsNotFound(db->EventsAfter("nope", 0, 0).status()));
  // A failed update wrote no event.
  EXPECT_EQ(db->EventsAfter("j", 0, 0)->size(), 3u);
}

TEST(MetadataStoreTest, ListJobsByStateNewestFirstWithPages) {
  TempDir dir;
  auto db = OpenDb(dir.File("meta.db"));
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(
        db->CreateJob(MakeJob(absl::StrCat("j", i), i % 2 == 0 ? v1::QUEUED : v1::RUNNING), nullptr).ok());
  }
  // j1 finishes: the state filter follows the update.
  v1::Job j1 = *db->GetJob("j1");
  j1.set_state(v1::SUCCEEDED);
  ASSERT_TRUE(db->UpdateJob(j1, StateEvent(v1::SUCCEEDED)).ok());

  std::vector<std::string> queued;
  std::string token;
  do {
    absl::StatusOr<JobPage> page = db->ListJobs("", {v1::QUEUED}, 3, token);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->jobs.size(), 3u);
    for (const auto& j : page->jobs) queued.push_back(j.id());
    token = page->next_page_token;
  } while (!token.empty());
  EXPECT_EQ(queued, (std::vector<std::string>{"j6", "j4", "j2", "j0"}));

  EXPECT_EQ(Ids(db->ListJobs("", {v1::RUNNING, v1::SUCCEEDED}, 0, "")->jobs),
            (std::vector<std::string>{"j5", "j3", "j1"}));
  EXPECT_EQ(Ids(db->ListJobs("", {v1::SUCCEEDED}, 0, "")->jobs), (std::vector<std::string>{"j1"}));
  EXPECT_EQ(db->ListJobs("", {}, 0, "")->jobs.size(), 7u);
  // An exact last page has no next token.
  EXPECT_TRUE(db->ListJobs("", {}, 7, "")->next_page_token.empty());

  EXPECT_EQ(Ids(*db->JobsInStates({v1::QUEUED, v1::RUNNING})),
            (std::vector<std::string>{"j0", "j2", "j3", "j4", "j5", "j6"}));  // oldest first
  EXPECT_TRUE(db->JobsInStates({v1::CANCELLED})->empty());

  // Repeated states count once; values outside the enum (proto3 lets clients send any
  // int) match nothing rather than meaning "all".
  EXPECT_EQ(Ids(db->ListJobs("", {v1::SUCCEEDED, v1::SUCCEEDED, static_cast<v1::JobState>(99)}, 0, "")->jobs),
            (std::vector<std::string>{"j1"}));
  EXPECT_TRUE(db->ListJobs("", {static_cast<v1::JobState>(99)}, 0, "")->jobs.empty());
  EXPECT_TRUE(db->JobsInStates({static_cast<v1::JobState>(-1)})->empty());
}

TEST(MetadataStoreTest, CountJobsUsingModel) {
  TempDir dir;
  auto db = OpenDb(dir.File("meta.db"));
  ASSERT_TRUE(db->CreateJob(MakeJob("a", v1::QUEUED, "", "sha256:x"), nullptr).ok());
  ASSERT_TRUE(db->CreateJob(MakeJob("b", v1::RUNNING, "", "sha256:x"), nullptr).ok());
  ASSERT_TRUE(db->CreateJob(MakeJob("c", v1::SUCCEEDED, "", "sha256:x"), nullptr).ok());
  ASSERT_TRUE(db->CreateJob(MakeJob("d", v1::QUEUED, "", "sha256:y"), nullptr).ok());
  EXPECT_EQ(*db->CountJobsUsingModel("t", "sha256:x", {v1::QUEUED, v1::RUNNING, v1::CANCELLING}), 2);
  EXPECT_EQ(*db->CountJobsUsingModel("t", "sha256:x", {}), 3);
  EXPECT_EQ(*db->CountJobsUsingModel("t", "sha256:z", {v1::QUEUED}), 0);
}

TEST(MetadataStoreTest, Results) {
  TempDir dir;
  auto db = OpenDb(dir.File("meta.db"));
  ASSERT_TRUE(db->CreateJob(MakeJob("j", v1::RUNNING), nullptr).ok());
  EXPECT_TRUE(absl::IsNotFound(db->GetResult("j", v1::MODEL).status()));
  EXPECT_FALSE(*db->BlobReferenced("aaaa"));
  ASSERT_TRUE(db->PutResult("j", v1::MODEL, ResultRef{"aaaa", 10}).ok());
  ASSERT_TRUE(db->PutResult("j", v1::REPORT, ResultRef{"bbbb", 20}).ok());
  ASSERT_TRUE(db->PutResult("j", v1::REPORT, ResultRef{"cccc", 30}).ok());  // replaces
  EXPECT_EQ(db->GetResult("j", v1::MODEL)->sha256, "aaaa");
  EXPECT_EQ(db->GetResult("j", v1::REPORT)->size, 30);
  EXPECT_TRUE(*db->BlobReferenced("aaaa"));
  EXPECT_FALSE(*db->BlobReferenced("bbbb"));
  EXPECT_TRUE(absl::IsNotFound(db->GetResult("j", v1::BN_BUFFERS).status()));
  EXPECT_TRUE(absl::IsNotFound(db->PutResult("nope", v1::MODEL, ResultRef{"aaaa", 1})));
  EXPECT_TRUE(absl::IsInvalidArgument(db->PutResult("j", v1::ARTIFACT_UNSPECIFIED, ResultRef{"aaaa", 1})));
}

TEST(MetadataStoreTest, EverythingSurvivesReopen) {
  TempDir dir;
  const std::string path = dir.File("meta.db");
  {
    auto db = OpenDb(path);
    ASSERT_TRUE(db->PutModel(MakeModel("sha256:m", "resnet")).ok());
    v1::Job job = MakeJob("j", v1::QUEUED, "req");
    ASSERT_TRUE(db->CreateJob(job, nullptr).ok());
    job.set_state(v1::RUNNING);
    ASSERT_TRUE(db->UpdateJob(job, StateEvent(v1::RUNNING)).ok());
    ASSERT_TRUE(db->PutResult("j", v1::MODEL, ResultRef{"abcd", 5}).ok());
  }
  auto db = OpenDb(path);
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

TEST(MetadataStoreTest, CommittedWritesSurviveAProcessKilledWithoutClosing) {
  TempDir dir;
  const std::string path = dir.File("meta.db");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto db = OpenMetadataStore(path);
    bool ok = db.ok();
    if (ok) {
      v1::Job job = MakeJob("j", v1::QUEUED);
      ok = (*db)->CreateJob(job, nullptr).ok();
      job.set_state(v1::RUNNING);
      ok = ok && (*db)->UpdateJob(job, StateEvent(v1::RUNNING)).ok();
    }
    ::_exit(ok ? 0 : 1);  // the connection is never closed; only the WAL has the data
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto db = OpenDb(path);
  EXPECT_EQ(db->GetJob("j")->state(), v1::RUNNING);
  EXPECT_EQ(db->EventsAfter("j", 0, 0)->size(), 1u);
}

TEST(MetadataStoreTest, ConcurrentEventsKeepSeqUniqueAndDense) {
  TempDir dir;
  auto db = OpenDb(dir.File("meta.db"));
  ASSERT_TRUE(db->CreateJob(MakeJob("j", v1::RUNNING), nullptr).ok());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 15;
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> seqs(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        absl::StatusOr<v1::JobEvent> e;
        if (i % 2 == 0) {
          e = db->UpdateJob(MakeJob("j", v1::RUNNING), StateEvent(v1::RUNNING));
        } else {
          v1::JobEvent p;
          p.mutable_progress()->set_batches_done(i);
          e = db->AppendEvent("j", p);
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
  std::vector<v1::JobEvent> stored = *db->EventsAfter("j", 0, 0);
  ASSERT_EQ(stored.size(), all.size());
  for (size_t i = 0; i < stored.size(); ++i) EXPECT_EQ(stored[i].seq(), static_cast<int64_t>(i) + 1);
}

TEST(MetadataStoreTest, OpenFailsWithAnActionableMessage) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<MetadataStore>> db = OpenMetadataStore(dir.File("no/such/dir/meta.db"));
  ASSERT_FALSE(db.ok());
  EXPECT_NE(db.status().message().find("no/such/dir/meta.db"), absl::string_view::npos) << db.status();
}

}  // namespace
}  // namespace recal::store
