// What only the SQLite backend has: files from older releases, a directory that must exist,
// a process killed without closing (WAL).
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/metadata_store.h"
#include "tests/store/metadata_test_util.h"
#include "tests/test_util.h"

namespace recal::store {
namespace {

using ::recal::store::test::DigestId;
using ::recal::store::test::ExpectPreV6JobsCountAsActiveButInNoMinute;
using ::recal::store::test::ExpectPreV7ModelsNumberedInCreationOrder;
using ::recal::store::test::ExpectPreV8JobsReadAnEmptyPlan;
using ::recal::store::test::ExpectPreV9ModelsCountAndReservationsAreTakenBesideThem;
using ::recal::store::test::Ids;
using ::recal::store::test::MakeJob;
using ::recal::store::test::MakeModel;
using ::recal::store::test::OpenDb;
using ::recal::store::test::StateEvent;
using ::recal::testing::TempDir;

// Schema version 3 as a release made it: version 2's tables and indexes, version 3's columns.
constexpr char kSchemaV3[] =
    "CREATE TABLE models (tenant TEXT NOT NULL, id TEXT NOT NULL, create_seq INTEGER NOT NULL UNIQUE, "
    "size INTEGER NOT NULL, proto BLOB NOT NULL, PRIMARY KEY (tenant, id));"
    "CREATE TABLE jobs (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, request_id TEXT, state INTEGER NOT NULL, "
    "model_id TEXT NOT NULL, create_seq INTEGER NOT NULL UNIQUE, proto BLOB NOT NULL, "
    "UNIQUE (tenant, request_id));"
    "CREATE INDEX models_by_id ON models(id);"
    "CREATE INDEX jobs_by_state ON jobs(state, create_seq);"
    "CREATE INDEX jobs_by_model ON jobs(model_id, state);"
    "CREATE INDEX jobs_by_tenant ON jobs(tenant, create_seq);"
    "CREATE TABLE events (job_id TEXT NOT NULL, seq INTEGER NOT NULL, proto BLOB NOT NULL, "
    "PRIMARY KEY (job_id, seq)) WITHOUT ROWID;"
    "CREATE TABLE results (job_id TEXT NOT NULL, artifact INTEGER NOT NULL, sha256 TEXT NOT NULL, "
    "size INTEGER NOT NULL, PRIMARY KEY (job_id, artifact)) WITHOUT ROWID;"
    "CREATE INDEX results_by_blob ON results(sha256);"
    "ALTER TABLE jobs ADD COLUMN version INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE jobs ADD COLUMN started_ms INTEGER;"
    "ALTER TABLE jobs ADD COLUMN lease_owner TEXT;"
    "ALTER TABLE jobs ADD COLUMN lease_until_ms INTEGER;"
    "CREATE INDEX jobs_to_claim ON jobs(state, priority, create_seq);"
    "CREATE INDEX jobs_started_by_tenant ON jobs(tenant, started_ms);";

// What version 4 (sharded jobs) and version 5 (worker endpoints) added to version 3.
constexpr char kSchemaV4AndV5[] =
    "ALTER TABLE jobs ADD COLUMN parent_id TEXT;"
    "ALTER TABLE jobs ADD COLUMN coordinated INTEGER NOT NULL DEFAULT 0;"
    "DROP INDEX jobs_to_claim;"
    "CREATE INDEX jobs_to_claim ON jobs(state, coordinated, priority, create_seq);"
    "CREATE INDEX jobs_by_parent ON jobs(parent_id, create_seq);"
    "CREATE TABLE worker_endpoints (owner TEXT PRIMARY KEY, address TEXT NOT NULL, updated_ms INTEGER NOT NULL) "
    "WITHOUT ROWID;";

// What version 6 (creation times) and version 7 (model names and versions) added to version 5.
constexpr char kSchemaV6AndV7[] =
    "ALTER TABLE jobs ADD COLUMN created_ms INTEGER;"
    "CREATE INDEX jobs_created_by_tenant ON jobs(tenant, created_ms);"
    "ALTER TABLE models ADD COLUMN name TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE models ADD COLUMN version INTEGER NOT NULL DEFAULT 0;"
    "CREATE TABLE model_names (tenant TEXT NOT NULL, name TEXT NOT NULL, last_version INTEGER NOT NULL, "
    "PRIMARY KEY (tenant, name)) WITHOUT ROWID;"
    "CREATE UNIQUE INDEX models_by_name ON models(tenant, name, version);";

// The first column of every row of `sql`, as text ("NULL" for NULL).
std::vector<std::string> QueryColumn(sqlite3* raw, const std::string& sql) {
  std::vector<std::string> rows;
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(raw, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    const unsigned char* text = sqlite3_column_text(stmt, 0);
    rows.push_back(text == nullptr ? "NULL" : reinterpret_cast<const char*>(text));
  }
  sqlite3_finalize(stmt);
  return rows;
}

TEST(SqliteMetadataStoreTest, ADatabaseFromBeforeTenantsBecomesTheDefaultTenants) {
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
  EXPECT_EQ(model->version(), 1);
  EXPECT_EQ(db->GetModelVersion(kDefaultTenant, "old", 0)->id(), "sha256:a");
  EXPECT_EQ(model->tenant(), kDefaultTenant);
  EXPECT_EQ(db->GetJob("old-job")->tenant(), kDefaultTenant);
  EXPECT_EQ(db->FindJobByRequestId(kDefaultTenant, "key")->id(), "old-job");
  EXPECT_EQ(db->GetResult("old-job", v1::MODEL)->size, 7);
  EXPECT_EQ(*db->JobPlan("old-job"), "");
  EXPECT_EQ(db->Usage(kDefaultTenant)->stored_bytes, 42 + 7);
  bool created = false;
  ASSERT_TRUE(db->CreateJob(MakeJob("new-job", v1::QUEUED, "", "sha256:a", kDefaultTenant), &created).ok());
  EXPECT_EQ(Ids(db->ListJobs("", {}, 0, "")->jobs), (std::vector<std::string>{"new-job", "old-job"}));
}

// Schema version 3 (before sharded jobs) as the previous release made it: its jobs become
// top-level, uncoordinated jobs, claimed by run claimers as before.
TEST(SqliteMetadataStoreTest, ADatabaseFromBeforeShardedJobsKeepsItsJobsTopLevel) {
  TempDir dir;
  const std::string path = dir.File("meta.db");
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
    v1::Job queued = MakeJob("queued", v1::QUEUED, "key");
    queued.mutable_spec()->set_priority(3);
    const v1::Job done = MakeJob("done", v1::SUCCEEDED);
    std::string sql = kSchemaV3;
    absl::StrAppend(&sql, "INSERT INTO jobs(id, tenant, request_id, state, model_id, create_seq, proto, priority) "
                          "VALUES('queued', 't', 'key', ", int{v1::QUEUED}, ", 'sha256:m', 1, x'",
                    absl::BytesToHexString(queued.SerializeAsString()), "', 3);");
    absl::StrAppend(&sql, "INSERT INTO jobs(id, tenant, request_id, state, model_id, create_seq, proto) "
                          "VALUES('done', 't', NULL, ", int{v1::SUCCEEDED}, ", 'sha256:m', 2, x'",
                    absl::BytesToHexString(done.SerializeAsString()), "');");
    absl::StrAppend(&sql, "INSERT INTO events VALUES('done', 1, x'",
                    absl::BytesToHexString(StateEvent(v1::SUCCEEDED).SerializeAsString()), "');");
    absl::StrAppend(&sql, "PRAGMA user_version = 3;");
    ASSERT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
    sqlite3_close(raw);
  }
  {
    auto db = OpenDb(path);
    ASSERT_NE(db, nullptr);
    EXPECT_EQ(Ids(db->ListJobs("", {}, 0, "")->jobs), (std::vector<std::string>{"done", "queued"}));
    EXPECT_EQ(*db->CountJobsInStates({}), 2);
    EXPECT_EQ(*db->CountJobsUsingModel("t", "sha256:m", {}), 2);
    EXPECT_EQ(db->Usage("t")->active_jobs, 1);
    EXPECT_EQ(db->FindJobByRequestId("t", "key")->id(), "queued");
    EXPECT_TRUE(db->ChildJobs("queued")->empty());
    EXPECT_EQ(db->EventsAfter("done", 0, 0)->size(), 1u);
    const auto to_running = [](v1::Job& job, std::vector<v1::JobEvent>& events) {
      job.set_state(v1::RUNNING);
      events.push_back(StateEvent(v1::RUNNING));
      return absl::OkStatus();
    };
    EXPECT_FALSE(db->ClaimJob("c", 0, to_running, ClaimKind::kCoordinate)->has_value());
    auto claimed = db->ClaimJob("w", 0, to_running, ClaimKind::kRun);
    ASSERT_TRUE(claimed.ok()) << claimed.status();
    ASSERT_TRUE(claimed->has_value());
    EXPECT_EQ((*claimed)->id(), "queued");
  }
  // The schema is the current one: version 4's columns and indexes, the old rows at their
  // defaults, version 5's table of worker endpoints and version 6's creation times (none for
  // old rows).
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  const auto query = [&](const std::string& sql) { return QueryColumn(raw, sql); };
  EXPECT_EQ(query("PRAGMA user_version"), std::vector<std::string>{"9"});
  EXPECT_EQ(query("SELECT COALESCE(created_ms, 'NULL') FROM jobs ORDER BY create_seq"),
            (std::vector<std::string>{"NULL", "NULL"}));
  EXPECT_EQ(query("SELECT name FROM sqlite_master WHERE name = 'worker_endpoints'"),
            std::vector<std::string>{"worker_endpoints"});
  EXPECT_EQ(query("SELECT id || ':' || COALESCE(parent_id, 'NULL') || ':' || coordinated FROM jobs ORDER BY create_seq"),
            (std::vector<std::string>{"queued:NULL:0", "done:NULL:0"}));
  EXPECT_EQ(query("SELECT sql FROM sqlite_master WHERE name = 'jobs_to_claim'"),
            std::vector<std::string>{"CREATE INDEX jobs_to_claim ON jobs(state, coordinated, priority, create_seq)"});
  EXPECT_EQ(query("SELECT name FROM sqlite_master WHERE name = 'jobs_by_parent'"),
            std::vector<std::string>{"jobs_by_parent"});
  sqlite3_close(raw);
}

// Schema version 5 (before jobs had a creation time) as the previous release made it: its
// jobs count as active for max_active_jobs, and in no minute for max_submissions_per_minute.
TEST(SqliteMetadataStoreTest, ADatabaseFromBeforeCreationTimesCountsItsJobsAsActiveButInNoMinute) {
  TempDir dir;
  const std::string path = dir.File("meta.db");
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
    const v1::Job queued = MakeJob("queued", v1::QUEUED, "key");
    const v1::Job done = MakeJob("done", v1::SUCCEEDED);
    std::string sql = absl::StrCat(kSchemaV3, kSchemaV4AndV5);
    absl::StrAppend(&sql, "INSERT INTO jobs(id, tenant, request_id, state, model_id, create_seq, proto) "
                          "VALUES('queued', 't', 'key', ", int{v1::QUEUED}, ", 'sha256:m', 1, x'",
                    absl::BytesToHexString(queued.SerializeAsString()), "');");
    absl::StrAppend(&sql, "INSERT INTO jobs(id, tenant, request_id, state, model_id, create_seq, proto) "
                          "VALUES('done', 't', NULL, ", int{v1::SUCCEEDED}, ", 'sha256:m', 2, x'",
                    absl::BytesToHexString(done.SerializeAsString()), "');");
    absl::StrAppend(&sql, "PRAGMA user_version = 5;");
    ASSERT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
    sqlite3_close(raw);
  }
  {
    auto db = OpenDb(path);
    ASSERT_NE(db, nullptr);
    ExpectPreV6JobsCountAsActiveButInNoMinute(*db);
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  EXPECT_EQ(QueryColumn(raw, "PRAGMA user_version"), std::vector<std::string>{"9"});
  EXPECT_EQ(QueryColumn(raw, "SELECT id || ':' || COALESCE(created_ms, 'NULL') FROM jobs WHERE created_ms IS NULL "
                             "ORDER BY create_seq"),
            (std::vector<std::string>{"queued:NULL", "done:NULL"}));
  EXPECT_EQ(QueryColumn(raw, "SELECT id FROM jobs WHERE created_ms IS NOT NULL ORDER BY create_seq"),
            (std::vector<std::string>{"new", "second"}));
  EXPECT_EQ(QueryColumn(raw, "SELECT sql FROM sqlite_master WHERE name = 'jobs_created_by_tenant'"),
            std::vector<std::string>{"CREATE INDEX jobs_created_by_tenant ON jobs(tenant, created_ms)"});
  sqlite3_close(raw);
}

// Schema version 6 (before model names and versions) as the previous release made it: each
// tenant's models are numbered per name in creation order (rows inserted out of that order).
TEST(SqliteMetadataStoreTest, ADatabaseFromBeforeModelVersionsNumbersItsModelsInCreationOrder) {
  TempDir dir;
  const std::string path = dir.File("meta.db");
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
    std::string sql = absl::StrCat(kSchemaV3, kSchemaV4AndV5,
                                   "ALTER TABLE jobs ADD COLUMN created_ms INTEGER;"
                                   "CREATE INDEX jobs_created_by_tenant ON jobs(tenant, created_ms);");
    struct Row {
      const char* hex;
      const char* name;
      const char* tenant;
      int create_seq;
    };
    for (const Row& row : {Row{"c3", "rn50", "t", 3}, Row{"a1", "rn50", "t", 1}, Row{"d4", "rn50", "u", 4},
                           Row{"b2", "", "t", 2}}) {
      const v1::Model model = MakeModel(DigestId(row.hex), row.name, "");  // old protos may lack the tenant
      absl::StrAppend(&sql, "INSERT INTO models VALUES('", row.tenant, "', '", model.id(), "', ", row.create_seq,
                      ", 42, x'", absl::BytesToHexString(model.SerializeAsString()), "');");
    }
    absl::StrAppend(&sql, "PRAGMA user_version = 6;");
    ASSERT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
    sqlite3_close(raw);
  }
  {
    auto db = OpenDb(path);
    ASSERT_NE(db, nullptr);
    ExpectPreV7ModelsNumberedInCreationOrder(*db);
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  EXPECT_EQ(QueryColumn(raw, "PRAGMA user_version"), std::vector<std::string>{"9"});
  EXPECT_EQ(QueryColumn(raw, "SELECT tenant || '/' || name || ':' || version FROM models ORDER BY create_seq"),
            (std::vector<std::string>{"t/rn50:1", "t/model:1", "t/rn50:2", "u/rn50:1", "t/rn50:3", "u/rn50:2"}));
  EXPECT_EQ(QueryColumn(raw, "SELECT tenant || '/' || name || ':' || last_version FROM model_names "
                             "ORDER BY tenant, name"),
            (std::vector<std::string>{"t/model:1", "t/rn50:3", "u/rn50:2"}));
  sqlite3_close(raw);
}

// Schema version 7 (before plans) as the previous release made it: its jobs read an empty
// plan, its models keep their names and versions, and new jobs store theirs.
TEST(SqliteMetadataStoreTest, ADatabaseFromBeforePlansReadsItsJobsPlansEmpty) {
  TempDir dir;
  const std::string path = dir.File("meta.db");
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
    const v1::Job old = MakeJob("old", v1::QUEUED, "key");
    const v1::Model model = MakeModel(DigestId("a1"), "rn50");
    std::string sql = absl::StrCat(kSchemaV3, kSchemaV4AndV5, kSchemaV6AndV7);
    absl::StrAppend(&sql, "INSERT INTO jobs(id, tenant, request_id, state, model_id, create_seq, proto, created_ms) "
                          "VALUES('old', 't', 'key', ", int{v1::QUEUED}, ", 'sha256:m', 1, x'",
                    absl::BytesToHexString(old.SerializeAsString()), "', 1000);");
    absl::StrAppend(&sql, "INSERT INTO models VALUES('t', '", model.id(), "', 1, 42, x'",
                    absl::BytesToHexString(model.SerializeAsString()), "', 'rn50', 1);");
    absl::StrAppend(&sql, "INSERT INTO model_names VALUES('t', 'rn50', 1);");
    absl::StrAppend(&sql, "PRAGMA user_version = 7;");
    ASSERT_EQ(sqlite3_exec(raw, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
    sqlite3_close(raw);
  }
  {
    auto db = OpenDb(path);
    ASSERT_NE(db, nullptr);
    ExpectPreV8JobsReadAnEmptyPlan(*db);
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  EXPECT_EQ(QueryColumn(raw, "PRAGMA user_version"), std::vector<std::string>{"9"});
  // hex(NULL) is '': tell NULL (the old row's) apart.
  EXPECT_EQ(QueryColumn(raw, "SELECT id || ':' || CASE WHEN plan IS NULL THEN 'NULL' ELSE hex(plan) END FROM jobs "
                             "ORDER BY create_seq"),
            (std::vector<std::string>{"old:NULL", "new:7000FF"}));
  sqlite3_close(raw);
}

TEST(SqliteMetadataStoreTest, ADatabaseFromBeforeReservationsGetsTheTableAndItsModelsCountAsBefore) {
  TempDir dir;
  const std::string path = dir.File("meta.db");
  {
    auto db = OpenDb(path);
    ASSERT_NE(db, nullptr);
    ASSERT_TRUE(db->PutModel(MakeModel(DigestId("a1"), "rn50")).ok());
  }
  {  // back to version 8, as a server from before left it
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(raw, "DROP TABLE reservations; PRAGMA user_version = 8;", nullptr, nullptr, nullptr),
              SQLITE_OK)
        << sqlite3_errmsg(raw);
    sqlite3_close(raw);
  }
  {
    auto db = OpenDb(path);
    ASSERT_NE(db, nullptr);
    ExpectPreV9ModelsCountAndReservationsAreTakenBesideThem(*db);
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  EXPECT_EQ(QueryColumn(raw, "PRAGMA user_version"), std::vector<std::string>{"9"});
  EXPECT_EQ(QueryColumn(raw, "SELECT key || ':' || bytes FROM reservations"),
            std::vector<std::string>{UploadReservationKey("b2") + ":58"});
  sqlite3_close(raw);
}

TEST(SqliteMetadataStoreTest, CommittedWritesSurviveAProcessKilledWithoutClosing) {
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

TEST(SqliteMetadataStoreTest, OpenFailsWithAnActionableMessage) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<MetadataStore>> db = OpenMetadataStore(dir.File("no/such/dir/meta.db"));
  ASSERT_FALSE(db.ok());
  EXPECT_NE(db.status().message().find("no/such/dir/meta.db"), absl::string_view::npos) << db.status();
}

// The database deleted, or another file put in its place, under a running server: every
// later call fails with DATA_LOSS naming the file (the health check is one such call), and
// nothing is written to the file nobody will open again.
TEST(SqliteMetadataStoreTest, ADatabaseFileRemovedOrReplacedIsNeverWrittenPast) {
  for (const bool replace : {false, true}) {
    SCOPED_TRACE(replace ? "replaced" : "removed");
    TempDir dir;
    const std::string path = dir.File("meta.db");
    auto db = OpenDb(path);
    ASSERT_TRUE(db->CreateJob(MakeJob("before", v1::QUEUED), nullptr).ok());
    ASSERT_EQ(std::rename(path.c_str(), dir.File("moved.db").c_str()), 0);
    if (replace) OpenDb(path);  // a fresh database at the same path

    absl::StatusOr<int64_t> counted = db->CountJobsInStates({v1::QUEUED});
    EXPECT_EQ(counted.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(counted.status().message()),
                ::testing::AllOf(::testing::HasSubstr(path), ::testing::HasSubstr(replace ? "replaced" : "gone"),
                                 ::testing::HasSubstr("restart the server")));
    EXPECT_EQ(db->CreateJob(MakeJob("after", v1::QUEUED), nullptr).status().code(), absl::StatusCode::kDataLoss);
    if (replace) {
      EXPECT_FALSE(OpenDb(path)->GetJob("after").ok());  // the new file got nothing
    }
  }
}

}  // namespace
}  // namespace recal::store
