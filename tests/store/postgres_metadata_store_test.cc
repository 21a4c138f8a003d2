// What only the PostgreSQL backend has: URIs, lost connections, schema versions in the
// database, text it cannot hold, a pool of connections.
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/store/metadata_store.h"
#include "server/store/postgres_metadata_store.h"
#include "server/store/postgres_util.h"
#include "tests/store/metadata_test_util.h"
#include "tests/store/postgres_server.h"

namespace recal::store {
namespace {

using ::recal::store::test::DigestId;
using ::recal::store::test::ExpectPreV6JobsCountAsActiveButInNoMinute;
using ::recal::store::test::ExpectPreV7ModelsNumberedInCreationOrder;
using ::recal::store::test::ExpectPreV8JobsReadAnEmptyPlan;
using ::recal::store::test::ExpectPreV9ModelsCountAndReservationsAreTakenBesideThem;
using ::recal::store::test::MakeModel;
using ::recal::store::test::Ids;
using ::recal::store::test::MakeJob;
using ::recal::store::test::OpenDb;
using ::recal::store::test::StateEvent;
using ::recal::store::internal::pg::Connection;
using ::recal::testing::PostgresServer;

class PostgresMetadataStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<PostgresServer*> server = PostgresServer::Shared();
    if (absl::IsNotFound(server.status())) GTEST_SKIP() << server.status().message();
    ASSERT_TRUE(server.ok()) << server.status();
    absl::StatusOr<std::string> uri = (*server)->NewDatabase();
    ASSERT_TRUE(uri.ok()) << uri.status();
    uri_ = *uri;
  }
  std::string uri_;
};

TEST_F(PostgresMetadataStoreTest, BothUriSchemesOpenIt) {
  ASSERT_TRUE(absl::StartsWith(uri_, "postgresql://"));
  auto db = OpenDb(uri_);
  ASSERT_NE(db, nullptr);
  ASSERT_TRUE(db->CreateJob(MakeJob("j", v1::QUEUED), nullptr).ok());
  auto short_scheme = OpenDb(absl::StrCat("postgres://", uri_.substr(std::strlen("postgresql://"))));
  ASSERT_NE(short_scheme, nullptr);
  EXPECT_EQ(short_scheme->GetJob("j")->id(), "j");
}

TEST_F(PostgresMetadataStoreTest, ReconnectsWhenTheServerDropsTheConnection) {
  auto db = OpenDb(uri_);
  ASSERT_NE(db, nullptr);
  ASSERT_TRUE(db->CreateJob(MakeJob("j", v1::QUEUED), nullptr).ok());
  // Ends every other session on the database and waits until they are gone, as a server
  // restart or a failover would.
  const std::string drop_others =
      "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
      "WHERE datname = current_database() AND pid <> pg_backend_pid()";
  ASSERT_TRUE(PostgresServer::Execute(uri_, drop_others).ok());
  absl::StatusOr<v1::Job> job = db->GetJob("j");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::QUEUED);
  // A write whose transaction never reached COMMIT is redone on the new connection.
  ASSERT_TRUE(PostgresServer::Execute(uri_, drop_others).ok());
  absl::StatusOr<v1::JobEvent> event = db->AppendEvent("j", StateEvent(v1::QUEUED));
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(event->seq(), 1);
  EXPECT_EQ(db->EventsAfter("j", 0, 0)->size(), 1u);
}

// Another process's transaction holds the row of job "locked" (SELECT ... FOR UPDATE) until
// Release; an AppendEvent to it waits on that lock.
class LockedJob {
 public:
  explicit LockedJob(const std::string& uri) : conn_(Connection::Open(uri)) {
    EXPECT_TRUE(conn_.ok()) << conn_.status();
    EXPECT_TRUE(conn_->Exec("BEGIN").ok());
    EXPECT_TRUE(conn_->Exec("SELECT id FROM jobs WHERE id = 'locked' FOR UPDATE").ok());
  }
  void Release() { EXPECT_TRUE(conn_->Exec("COMMIT").ok()); }
  // Whether a session of the database waits on a lock now.
  bool SomeoneWaits() {
    auto r = conn_->Exec("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                         "AND wait_event_type = 'Lock'");
    return r.ok() && r->Int64(0, 0) > 0;
  }

 private:
  absl::StatusOr<Connection> conn_;
};

// An AppendEvent stuck behind `locked`, and then, on another thread, the calls a busy api
// replica makes meanwhile (a read and a write of another job): whether those ended within
// `wait`. Releases the lock and joins before it returns.
bool OtherCallsEndWhileOneWaitsOnALock(MetadataStore& db, LockedJob& lock, absl::Duration wait) {
  absl::Notification appended;
  std::thread stuck([&] {
    EXPECT_TRUE(db.AppendEvent("locked", StateEvent(v1::QUEUED)).ok());
    appended.Notify();
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!lock.SomeoneWaits() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(lock.SomeoneWaits()) << "the AppendEvent never waited on the row lock";
  absl::Notification others_done;
  std::thread others([&] {
    EXPECT_TRUE(db.GetJob("free").ok());
    EXPECT_TRUE(db.AppendEvent("free", StateEvent(v1::QUEUED)).ok());
    others_done.Notify();
  });
  const bool ended = others_done.WaitForNotificationWithTimeout(wait);
  EXPECT_FALSE(appended.HasBeenNotified()) << "the lock did not hold the AppendEvent";
  lock.Release();
  stuck.join();
  others.join();
  EXPECT_TRUE(appended.HasBeenNotified());
  return ended;
}

TEST_F(PostgresMetadataStoreTest, ACallWaitingOnALockHoldsUpNoOtherCallOfTheProcess) {
  auto db = OpenDb(uri_);
  ASSERT_NE(db, nullptr);
  ASSERT_TRUE(db->CreateJob(MakeJob("locked", v1::QUEUED), nullptr).ok());
  ASSERT_TRUE(db->CreateJob(MakeJob("free", v1::QUEUED), nullptr).ok());
  LockedJob lock(uri_);
  EXPECT_TRUE(OtherCallsEndWhileOneWaitsOnALock(*db, lock, absl::Seconds(60)))
      << "a call waiting on a lock held up the store's other calls";
  EXPECT_EQ(db->EventsAfter("locked", 0, 0)->size(), 1u);
  EXPECT_EQ(db->EventsAfter("free", 0, 0)->size(), 1u);
}

TEST_F(PostgresMetadataStoreTest, AStoreOfOneConnectionTakesTurns) {
  absl::StatusOr<std::unique_ptr<PostgresMetadataStore>> opened = PostgresMetadataStore::Open(uri_, 1);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<MetadataStore> db = *std::move(opened);
  ASSERT_TRUE(db->CreateJob(MakeJob("locked", v1::QUEUED), nullptr).ok());
  ASSERT_TRUE(db->CreateJob(MakeJob("free", v1::QUEUED), nullptr).ok());
  LockedJob lock(uri_);
  EXPECT_FALSE(OtherCallsEndWhileOneWaitsOnALock(*db, lock, absl::Seconds(2)))
      << "a store of one connection ran two calls at once";
  // Sixteen calls at once all go through the one connection.
  std::vector<std::thread> callers;
  for (int i = 0; i < 16; ++i) callers.emplace_back([&] { EXPECT_TRUE(db->GetJob("free").ok()); });
  for (std::thread& caller : callers) caller.join();
  EXPECT_TRUE(absl::IsInvalidArgument(PostgresMetadataStore::Open(uri_, 0).status()));
}

TEST_F(PostgresMetadataStoreTest, ADatabaseWithANewerSchemaIsRefused) {
  ASSERT_NE(OpenDb(uri_), nullptr);
  ASSERT_TRUE(PostgresServer::Execute(uri_, "UPDATE schema_version SET version = 99").ok());
  absl::StatusOr<std::unique_ptr<MetadataStore>> db = OpenMetadataStore(uri_);
  ASSERT_TRUE(absl::IsFailedPrecondition(db.status())) << db.status();
  EXPECT_NE(db.status().message().find("schema version 99"), absl::string_view::npos) << db.status();
}

// Schema version 3 as a release made it (without its version row): version 2's tables and
// indexes, version 3's columns.
constexpr char kSchemaV3[] =
    "CREATE TABLE schema_version (version BIGINT NOT NULL);"
    "CREATE TABLE models (tenant TEXT NOT NULL, id TEXT NOT NULL, "
    "create_seq BIGINT GENERATED BY DEFAULT AS IDENTITY UNIQUE, size BIGINT NOT NULL, proto BYTEA NOT NULL, "
    "PRIMARY KEY (tenant, id));"
    "CREATE TABLE jobs (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, request_id TEXT, state BIGINT NOT NULL, "
    "model_id TEXT NOT NULL, create_seq BIGINT GENERATED BY DEFAULT AS IDENTITY UNIQUE, proto BYTEA NOT NULL, "
    "UNIQUE (tenant, request_id));"
    "CREATE INDEX models_by_id ON models(id);"
    "CREATE INDEX jobs_by_state ON jobs(state, create_seq);"
    "CREATE INDEX jobs_by_model ON jobs(model_id, state);"
    "CREATE INDEX jobs_by_tenant ON jobs(tenant, create_seq);"
    "CREATE TABLE events (job_id TEXT NOT NULL, seq BIGINT NOT NULL, proto BYTEA NOT NULL, "
    "PRIMARY KEY (job_id, seq));"
    "CREATE TABLE results (job_id TEXT NOT NULL, artifact BIGINT NOT NULL, sha256 TEXT NOT NULL, "
    "size BIGINT NOT NULL, PRIMARY KEY (job_id, artifact));"
    "CREATE INDEX results_by_blob ON results(sha256);"
    "ALTER TABLE jobs ADD COLUMN version BIGINT NOT NULL DEFAULT 0, ADD COLUMN priority BIGINT NOT NULL DEFAULT 0, "
    "ADD COLUMN started_ms BIGINT, ADD COLUMN lease_owner TEXT, ADD COLUMN lease_until_ms BIGINT;"
    "CREATE INDEX jobs_to_claim ON jobs(state, priority, create_seq);"
    "CREATE INDEX jobs_started_by_tenant ON jobs(tenant, started_ms);";

// What version 4 (sharded jobs) and version 5 (worker endpoints) added to version 3.
constexpr char kSchemaV4AndV5[] =
    "ALTER TABLE jobs ADD COLUMN parent_id TEXT, ADD COLUMN coordinated BOOLEAN NOT NULL DEFAULT false;"
    "DROP INDEX jobs_to_claim;"
    "CREATE INDEX jobs_to_claim ON jobs(state, coordinated, priority, create_seq);"
    "CREATE INDEX jobs_by_parent ON jobs(parent_id, create_seq);"
    "CREATE TABLE worker_endpoints (owner TEXT PRIMARY KEY, address TEXT NOT NULL, updated_ms BIGINT NOT NULL);";

// Schema version 3 (before sharded jobs) as the previous release made it: its jobs become
// top-level, uncoordinated jobs, claimed by run claimers as before.
TEST_F(PostgresMetadataStoreTest, ADatabaseFromBeforeShardedJobsKeepsItsJobsTopLevel) {
  v1::Job queued = MakeJob("queued", v1::QUEUED, "key");
  queued.mutable_spec()->set_priority(3);
  const v1::Job done = MakeJob("done", v1::SUCCEEDED);
  std::string sql = absl::StrCat(kSchemaV3, "INSERT INTO schema_version(version) VALUES(3);");
  absl::StrAppend(&sql, "INSERT INTO jobs(id, tenant, request_id, state, model_id, proto, priority) "
                        "VALUES('queued', 't', 'key', ", int{v1::QUEUED}, ", 'sha256:m', '\\x",
                  absl::BytesToHexString(queued.SerializeAsString()), "'::bytea, 3);");
  absl::StrAppend(&sql, "INSERT INTO jobs(id, tenant, state, model_id, proto) VALUES('done', 't', ",
                  int{v1::SUCCEEDED}, ", 'sha256:m', '\\x", absl::BytesToHexString(done.SerializeAsString()),
                  "'::bytea);");
  const absl::Status written = PostgresServer::Execute(uri_, sql);
  ASSERT_TRUE(written.ok()) << written;
  {
    auto db = OpenDb(uri_);
    ASSERT_NE(db, nullptr);
    EXPECT_EQ(Ids(db->ListJobs("", {}, 0, "")->jobs), (std::vector<std::string>{"done", "queued"}));
    EXPECT_EQ(*db->CountJobsInStates({}), 2);
    EXPECT_EQ(*db->CountJobsUsingModel("t", "sha256:m", {}), 2);
    EXPECT_EQ(db->Usage("t")->active_jobs, 1);
    EXPECT_EQ(db->FindJobByRequestId("t", "key")->id(), "queued");
    EXPECT_TRUE(db->ChildJobs("queued")->empty());
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
  // Version 4's columns and indexes, the old rows at their defaults, version 5's table of
  // worker endpoints, version 6's creation times (none for old rows); the version is the
  // current one.
  const std::string checks[] = {
      "DO $$ BEGIN IF (SELECT MAX(version) FROM schema_version) <> 9 THEN RAISE 'version'; END IF; END $$",
      "DO $$ BEGIN IF EXISTS (SELECT 1 FROM jobs WHERE created_ms IS NOT NULL) THEN RAISE 'created_ms'; END IF; "
      "END $$",
      "DO $$ BEGIN IF to_regclass('worker_endpoints') IS NULL THEN RAISE 'worker_endpoints'; END IF; END $$",
      "DO $$ BEGIN IF EXISTS (SELECT 1 FROM jobs WHERE parent_id IS NOT NULL OR coordinated) "
      "THEN RAISE 'old rows'; END IF; END $$",
      "DO $$ BEGIN IF (SELECT indexdef FROM pg_indexes WHERE indexname = 'jobs_to_claim') NOT LIKE "
      "'%(state, coordinated, priority, create_seq)' THEN RAISE 'claim index'; END IF; END $$",
      "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_indexes WHERE indexname = 'jobs_by_parent') "
      "THEN RAISE 'parent index'; END IF; END $$",
  };
  for (const std::string& check : checks) {
    const absl::Status s = PostgresServer::Execute(uri_, check);
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Schema version 5 (before jobs had a creation time) as the previous release made it: its
// jobs count as active for max_active_jobs, and in no minute for max_submissions_per_minute.
TEST_F(PostgresMetadataStoreTest, ADatabaseFromBeforeCreationTimesCountsItsJobsAsActiveButInNoMinute) {
  const v1::Job queued = MakeJob("queued", v1::QUEUED, "key");
  const v1::Job done = MakeJob("done", v1::SUCCEEDED);
  std::string sql = absl::StrCat(kSchemaV3, kSchemaV4AndV5, "INSERT INTO schema_version(version) VALUES(5);");
  absl::StrAppend(&sql, "INSERT INTO jobs(id, tenant, request_id, state, model_id, proto) "
                        "VALUES('queued', 't', 'key', ", int{v1::QUEUED}, ", 'sha256:m', '\\x",
                  absl::BytesToHexString(queued.SerializeAsString()), "'::bytea);");
  absl::StrAppend(&sql, "INSERT INTO jobs(id, tenant, state, model_id, proto) VALUES('done', 't', ",
                  int{v1::SUCCEEDED}, ", 'sha256:m', '\\x", absl::BytesToHexString(done.SerializeAsString()),
                  "'::bytea);");
  const absl::Status written = PostgresServer::Execute(uri_, sql);
  ASSERT_TRUE(written.ok()) << written;
  {
    auto db = OpenDb(uri_);
    ASSERT_NE(db, nullptr);
    ExpectPreV6JobsCountAsActiveButInNoMinute(*db);
  }
  const std::string checks[] = {
      "DO $$ BEGIN IF (SELECT MAX(version) FROM schema_version) <> 9 THEN RAISE 'version'; END IF; END $$",
      "DO $$ BEGIN IF (SELECT string_agg(id, ',' ORDER BY create_seq) FROM jobs WHERE created_ms IS NULL) "
      "<> 'queued,done' THEN RAISE 'old rows'; END IF; END $$",
      "DO $$ BEGIN IF (SELECT string_agg(id, ',' ORDER BY create_seq) FROM jobs WHERE created_ms IS NOT NULL) "
      "<> 'new,second' THEN RAISE 'new rows'; END IF; END $$",
      "DO $$ BEGIN IF (SELECT indexdef FROM pg_indexes WHERE indexname = 'jobs_created_by_tenant') NOT LIKE "
      "'%(tenant, created_ms)' THEN RAISE 'created index'; END IF; END $$",
  };
  for (const std::string& check : checks) {
    const absl::Status s = PostgresServer::Execute(uri_, check);
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Schema version 6 (before model names and versions) as the previous release made it: each
// tenant's models are numbered per name in creation order (rows inserted out of that order).
TEST_F(PostgresMetadataStoreTest, ADatabaseFromBeforeModelVersionsNumbersItsModelsInCreationOrder) {
  std::string sql = absl::StrCat(kSchemaV3, kSchemaV4AndV5,
                                 "ALTER TABLE jobs ADD COLUMN created_ms BIGINT;"
                                 "CREATE INDEX jobs_created_by_tenant ON jobs(tenant, created_ms);"
                                 "INSERT INTO schema_version(version) VALUES(6);");
  struct Row {
    const char* hex;
    const char* name;
    const char* tenant;
    int create_seq;
  };
  for (const Row& row : {Row{"c3", "rn50", "t", 3}, Row{"a1", "rn50", "t", 1}, Row{"d4", "rn50", "u", 4},
                         Row{"b2", "", "t", 2}}) {
    const v1::Model model = MakeModel(DigestId(row.hex), row.name, "");  // old protos may lack the tenant
    absl::StrAppend(&sql, "INSERT INTO models(tenant, id, create_seq, size, proto) VALUES('", row.tenant, "', '",
                    model.id(), "', ", row.create_seq, ", 42, '\\x",
                    absl::BytesToHexString(model.SerializeAsString()), "'::bytea);");
  }
  // New rows' create_seq must go on after the old ones, as the identity would have.
  absl::StrAppend(&sql, "SELECT setval(pg_get_serial_sequence('models', 'create_seq'), 4);");
  const absl::Status written = PostgresServer::Execute(uri_, sql);
  ASSERT_TRUE(written.ok()) << written;
  {
    auto db = OpenDb(uri_);
    ASSERT_NE(db, nullptr);
    ExpectPreV7ModelsNumberedInCreationOrder(*db);
  }
  const std::string checks[] = {
      "DO $$ BEGIN IF (SELECT MAX(version) FROM schema_version) <> 9 THEN RAISE 'version'; END IF; END $$",
      "DO $$ BEGIN IF (SELECT string_agg(tenant || '/' || name || ':' || version, ',' ORDER BY create_seq) "
      "FROM models) <> 't/rn50:1,t/model:1,t/rn50:2,u/rn50:1,t/rn50:3,u/rn50:2' THEN RAISE 'models'; END IF; END $$",
      "DO $$ BEGIN IF (SELECT string_agg(tenant || '/' || name || ':' || last_version, ',' ORDER BY tenant, name) "
      "FROM model_names) <> 't/model:1,t/rn50:3,u/rn50:2' THEN RAISE 'names'; END IF; END $$",
      "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_indexes WHERE indexname = 'models_by_name') "
      "THEN RAISE 'index'; END IF; END $$",
  };
  for (const std::string& check : checks) {
    const absl::Status s = PostgresServer::Execute(uri_, check);
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Schema version 7 (before plans) as the previous release made it: its jobs read an empty
// plan, its models keep their names and versions, and new jobs store theirs.
TEST_F(PostgresMetadataStoreTest, ADatabaseFromBeforePlansReadsItsJobsPlansEmpty) {
  const v1::Job old = MakeJob("old", v1::QUEUED, "key");
  const v1::Model model = MakeModel(DigestId("a1"), "rn50");
  std::string sql = absl::StrCat(
      kSchemaV3, kSchemaV4AndV5,
      "ALTER TABLE jobs ADD COLUMN created_ms BIGINT;"
      "CREATE INDEX jobs_created_by_tenant ON jobs(tenant, created_ms);"
      "ALTER TABLE models ADD COLUMN name TEXT NOT NULL DEFAULT '', ADD COLUMN version BIGINT NOT NULL DEFAULT 0;"
      "CREATE TABLE model_names (tenant TEXT NOT NULL, name TEXT NOT NULL, last_version BIGINT NOT NULL, "
      "PRIMARY KEY (tenant, name));"
      "CREATE UNIQUE INDEX models_by_name ON models(tenant, name, version);"
      "INSERT INTO schema_version(version) VALUES(7);");
  absl::StrAppend(&sql, "INSERT INTO jobs(id, tenant, request_id, state, model_id, proto, created_ms) "
                        "VALUES('old', 't', 'key', ", int{v1::QUEUED}, ", 'sha256:m', '\\x",
                  absl::BytesToHexString(old.SerializeAsString()), "'::bytea, 1000);");
  absl::StrAppend(&sql, "INSERT INTO models(tenant, id, size, proto, name, version) VALUES('t', '", model.id(),
                  "', 42, '\\x", absl::BytesToHexString(model.SerializeAsString()), "'::bytea, 'rn50', 1);");
  absl::StrAppend(&sql, "INSERT INTO model_names VALUES('t', 'rn50', 1);");
  const absl::Status written = PostgresServer::Execute(uri_, sql);
  ASSERT_TRUE(written.ok()) << written;
  {
    auto db = OpenDb(uri_);
    ASSERT_NE(db, nullptr);
    ExpectPreV8JobsReadAnEmptyPlan(*db);
  }
  const std::string checks[] = {
      "DO $$ BEGIN IF (SELECT MAX(version) FROM schema_version) <> 9 THEN RAISE 'version'; END IF; END $$",
      "DO $$ BEGIN IF (SELECT string_agg(id || ':' || COALESCE(encode(plan, 'hex'), 'NULL'), ',' "
      "ORDER BY create_seq) FROM jobs) <> 'old:NULL,new:7000ff' THEN RAISE 'plans'; END IF; END $$",
  };
  for (const std::string& check : checks) {
    const absl::Status s = PostgresServer::Execute(uri_, check);
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST_F(PostgresMetadataStoreTest, ADatabaseFromBeforeReservationsGetsTheTableAndItsModelsCountAsBefore) {
  {
    auto db = OpenDb(uri_);
    ASSERT_NE(db, nullptr);
    ASSERT_TRUE(db->PutModel(MakeModel(DigestId("a1"), "rn50")).ok());
  }
  // Back to version 8, as a server from before left it.
  const absl::Status downgraded =
      PostgresServer::Execute(uri_, "DROP TABLE reservations; UPDATE schema_version SET version = 8;");
  ASSERT_TRUE(downgraded.ok()) << downgraded;
  {
    auto db = OpenDb(uri_);
    ASSERT_NE(db, nullptr);
    ExpectPreV9ModelsCountAndReservationsAreTakenBesideThem(*db);
  }
  const absl::Status checked = PostgresServer::Execute(
      uri_, "DO $$ BEGIN IF (SELECT MAX(version) FROM schema_version) <> 9 THEN RAISE 'version'; END IF; END $$");
  EXPECT_TRUE(checked.ok()) << checked;
}

// PostgreSQL TEXT cannot hold a NUL byte (SQLite's can): refused rather than cut short.
TEST_F(PostgresMetadataStoreTest, TextWithANulByteIsInvalidArgument) {
  auto db = OpenDb(uri_);
  ASSERT_NE(db, nullptr);
  const std::string id("j\0k", 3);
  EXPECT_TRUE(absl::IsInvalidArgument(db->CreateJob(MakeJob(id, v1::QUEUED), nullptr).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(db->GetJob(id).status()));
  EXPECT_TRUE(absl::IsNotFound(db->GetJob("j").status()));
}

// Needs no server: nothing listens on port 1.
TEST(PostgresMetadataStoreOpenTest, AnUnreachableServerIsUnavailableNamingItButNotThePassword) {
  for (const std::string scheme : {"postgresql", "postgres"}) {
    absl::StatusOr<std::unique_ptr<MetadataStore>> db =
        OpenMetadataStore(absl::StrCat(scheme, "://recal:s3cret-pw@127.0.0.1:1/recal"));
    ASSERT_FALSE(db.ok());
    EXPECT_TRUE(absl::IsUnavailable(db.status())) << db.status();
    EXPECT_NE(db.status().message().find("127.0.0.1:1/recal"), absl::string_view::npos) << db.status();
    EXPECT_EQ(db.status().message().find("s3cret"), absl::string_view::npos) << db.status();
  }
  absl::StatusOr<std::unique_ptr<MetadataStore>> bad = OpenMetadataStore("postgresql://recal:s3cret%zz@127.0.0.1/recal");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_EQ(bad.status().message().find("s3cret"), absl::string_view::npos) << bad.status();
}

}  // namespace
}  // namespace recal::store
