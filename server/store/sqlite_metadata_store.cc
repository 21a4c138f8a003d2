#include "server/store/sqlite_metadata_store.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"
#include "server/store/job_creation.h"
#include "server/store/metadata_rows.h"
#include "server/store/sqlite_util.h"
#include "common/status_macros.h"

namespace recal::store {
namespace {

using internal::Db;
using internal::Query;
using internal::Transaction;
using namespace internal::rows;  // NOLINT: the rows helpers are this file's vocabulary

// PRAGMA user_version of the schema below. Bump it (and add a migration step in
// MigrateSchema) whenever a table changes.
constexpr int64_t kSchemaVersion = 9;

// create_seq is a per-table counter, so "newest first" and page tokens do not depend on
// clock resolution or clock steps. Every model and job belongs to one tenant: a model's
// bytes are stored once (blobs by digest), its row once per tenant that uploaded them; a
// request_id is unique within its tenant only, so one tenant's key never finds another's job.
constexpr char kTablesV2[] = R"sql(
CREATE TABLE models (
  tenant TEXT NOT NULL,
  id TEXT NOT NULL,
  create_seq INTEGER NOT NULL UNIQUE,
  size INTEGER NOT NULL,            -- always equal to proto.size
  proto BLOB NOT NULL,
  PRIMARY KEY (tenant, id)
);
CREATE TABLE jobs (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  request_id TEXT,                  -- NULL when the client gave none
  state INTEGER NOT NULL,           -- always equal to proto.state
  model_id TEXT NOT NULL,
  create_seq INTEGER NOT NULL UNIQUE,
  proto BLOB NOT NULL,
  UNIQUE (tenant, request_id)
);
)sql";
constexpr char kIndexesV2[] = R"sql(
CREATE INDEX models_by_id ON models(id);
CREATE INDEX jobs_by_state ON jobs(state, create_seq);
CREATE INDEX jobs_by_model ON jobs(model_id, state);
CREATE INDEX jobs_by_tenant ON jobs(tenant, create_seq);
)sql";
// Version 3: what workers need to share jobs (compare-and-set versions, claims in priority
// and fairness order, leases). The same step for a new database and an old one.
constexpr char kJobsV3[] = R"sql(
ALTER TABLE jobs ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN started_ms INTEGER;
ALTER TABLE jobs ADD COLUMN lease_owner TEXT;
ALTER TABLE jobs ADD COLUMN lease_until_ms INTEGER;
CREATE INDEX jobs_to_claim ON jobs(state, priority, create_seq);
CREATE INDEX jobs_started_by_tenant ON jobs(tenant, started_ms);
)sql";
// Version 4: sharded jobs. A shard has its parent's id (NULL: a top-level job, which is what
// every older row is); `coordinated` marks the parent of shards (IsCoordinated, fixed at
// insert), which only coordinating claimers take. The same step for a new database and an
// old one.
constexpr char kJobsV4[] = R"sql(
ALTER TABLE jobs ADD COLUMN parent_id TEXT;
ALTER TABLE jobs ADD COLUMN coordinated INTEGER NOT NULL DEFAULT 0;
DROP INDEX jobs_to_claim;
CREATE INDEX jobs_to_claim ON jobs(state, coordinated, priority, create_seq);
CREATE INDEX jobs_by_parent ON jobs(parent_id, create_seq);
)sql";
// Version 5: worker processes' internal endpoints, where api replicas relay pushed batches
// (cluster mode). The same step for a new database and an old one.
constexpr char kWorkerEndpointsV5[] = R"sql(
CREATE TABLE worker_endpoints (
  owner TEXT PRIMARY KEY,           -- the lease owner name of a worker process
  address TEXT NOT NULL,            -- host:port of its internal endpoint
  updated_ms INTEGER NOT NULL
) WITHOUT ROWID;
)sql";
// Version 6: when each job was created (Unix ms), which CreateJob counts for the per-minute
// submission quota in the transaction that stores the job. Rows from before have none
// (NULL) and no minute counts them, as the per-process count this replaces began empty at
// every start. The same step for a new database and an old one.
constexpr char kJobsV6[] = R"sql(
ALTER TABLE jobs ADD COLUMN created_ms INTEGER;
CREATE INDEX jobs_created_by_tenant ON jobs(tenant, created_ms);
)sql";
// Version 7: model names and versions. A model row is still one per tenant and bytes; its
// name and version are columns (NumberModels fills them for older rows, then the unique index
// is made), and model_names keeps the highest version each name ever had, so that a deleted
// version's number is never given to other bytes.
constexpr char kModelsV7[] = R"sql(
ALTER TABLE models ADD COLUMN name TEXT NOT NULL DEFAULT '';
ALTER TABLE models ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
CREATE TABLE model_names (
  tenant TEXT NOT NULL,
  name TEXT NOT NULL,
  last_version INTEGER NOT NULL,
  PRIMARY KEY (tenant, name)
) WITHOUT ROWID;
)sql";
constexpr char kModelVersionsIndexV7[] = "CREATE UNIQUE INDEX models_by_name ON models(tenant, name, version);";
// Version 8: each job's plan (opaque bytes: server/jobs makes and reads them), stored with
// the job's row when it is created. Rows from before have none (NULL), which reads as an
// empty plan. The same step for a new database and an old one.
constexpr char kJobsV8[] = "ALTER TABLE jobs ADD COLUMN plan BLOB;";
// Version 9: bytes reserved against each tenant's max_stored_bytes (MetadataStore::Reserve):
// an upload's from its first byte until its model row is written, a job's results until they
// are rows. touched_ms is when the holder last showed it is alive; ExpireReservations reads it.
// The same step for a new database and an old one.
constexpr char kReservationsV9[] = R"sql(
CREATE TABLE reservations (
  tenant TEXT NOT NULL,
  key TEXT NOT NULL,
  bytes INTEGER NOT NULL,
  touched_ms INTEGER NOT NULL,
  PRIMARY KEY (tenant, key)
) WITHOUT ROWID;
CREATE INDEX reservations_by_touch ON reservations(touched_ms);
)sql";
constexpr char kEventsAndResults[] = R"sql(
CREATE TABLE events (
  job_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  proto BLOB NOT NULL,
  PRIMARY KEY (job_id, seq)
) WITHOUT ROWID;
CREATE TABLE results (
  job_id TEXT NOT NULL,
  artifact INTEGER NOT NULL,
  sha256 TEXT NOT NULL,
  size INTEGER NOT NULL,
  PRIMARY KEY (job_id, artifact)
) WITHOUT ROWID;
CREATE INDEX results_by_blob ON results(sha256);
)sql";

// "(?3,?4,?5)": numbered placeholders for a state filter, bound by BindStates from
// `first_index` on. Numbered, because a bare "?" takes the largest index used so far + 1
// and would collide with numbered parameters elsewhere in the statement.
std::string Placeholders(int first_index, size_t n) {
  std::string s = "(";
  for (size_t i = 0; i < n; ++i) absl::StrAppend(&s, i == 0 ? "?" : ",?", first_index + static_cast<int>(i));
  return absl::StrCat(s, ")");
}

void BindStates(Query& q, int first_index, const std::vector<v1::JobState>& states) {
  for (size_t i = 0; i < states.size(); ++i) q.Bind(first_index + static_cast<int>(i), int64_t{states[i]});
}

}  // namespace

// Also answers CreateJob's queries (internal::JobCreation), inside its write transaction.
struct SqliteMetadataStore::Impl final : internal::JobCreationQueries {
  explicit Impl(Db db) : db(std::move(db)) {}
  std::mutex mu;  // guards db: one connection, one user at a time
  Db db;

  absl::Status MigrateSchema();
  // Version 1 had no tenants: its models and jobs become the default tenant's.
  absl::Status MigrateV1ToV2();
  absl::Status MigrateV2ToV3();
  absl::Status MigrateV3ToV4();
  absl::Status MigrateV4ToV5();
  absl::Status MigrateV5ToV6();
  absl::Status MigrateV7ToV8();
  // Gives every model a name and a version (rows::NumberVersions) and indexes them.
  absl::Status NumberModels();
  absl::Status InsertModel(const v1::Model& model);
  // The highest version `name` ever had in `tenant` (0: none); and its new value.
  absl::StatusOr<int64_t> LastVersion(const std::string& tenant, const std::string& name);
  absl::Status SetLastVersion(const std::string& tenant, const std::string& name, int64_t version);
  absl::StatusOr<std::optional<v1::Model>> FindModel(const std::string& tenant, const std::string& id);
  // `created_ms` nullopt: a row from before version 6 (migrated), which has none.
  absl::Status InsertJob(const v1::Job& job, const std::string& plan, std::optional<int64_t> created_ms);
  absl::StatusOr<std::vector<v1::Job>> QueryJobs(Query& q);
  // Whether the tenant has the model. Caller holds a transaction when it acts on the answer.
  absl::StatusOr<bool> ModelExists(const std::string& tenant, const std::string& id);

  // CreateJob's queries. The write transaction (BEGIN IMMEDIATE) holds the database's write
  // lock from its start: no other connection, in this process or another, stores a job or
  // deletes a model before it ends. So there is no tenant lock to take, and a model seen stays.
  absl::Status LockTenant(const std::string& /*tenant*/) override { return absl::OkStatus(); }
  absl::StatusOr<std::optional<v1::Job>> JobWithRequestId(const std::string& tenant,
                                                          const std::string& request_id) override;
  absl::StatusOr<internal::TopLevelJobCounts> CountTopLevelJobs(const std::string& tenant,
                                                                int64_t created_after_ms) override;
  absl::StatusOr<bool> HoldModel(const std::string& tenant, const std::string& model_id) override {
    return ModelExists(tenant, model_id);
  }
  absl::StatusOr<bool> InsertNewJob(const v1::Job& job, const std::vector<v1::JobEvent>& events,
                                    const std::string& plan, int64_t created_ms) override;
  absl::StatusOr<bool> JobExists(const std::string& id) override;
  // The tenant's top-level jobs that use the model and are, or have a shard that is, queued,
  // running or cancelling.
  absl::StatusOr<int64_t> CountActiveUsers(const std::string& tenant, const std::string& model_id);
  // Inserts the event with the next seq of the job and the current time. Caller holds a
  // transaction.
  absl::StatusOr<v1::JobEvent> InsertEvent(const std::string& job_id, v1::JobEvent event);
  absl::Status WriteJob(const v1::Job& job, int64_t expected_version = -1);
  // The tenants whose jobs hold as many workers as `max_running` allows them (AtRunningBound).
  // Caller holds a transaction.
  absl::StatusOr<std::set<std::string>> TenantsAtRunningBound(const MaxRunningJobs& max_running);
  absl::Status InsertResult(const std::string& job_id, v1::Artifact artifact, const ResultRef& ref);
  // The tenant's usage; a reservation under `except_key` is left out of it.
  absl::StatusOr<TenantUsage> CountUsage(const std::string& tenant, const std::string& except_key = "");
  absl::Status DeleteReservation(const std::string& tenant, const std::string& key);
};

absl::Status SqliteMetadataStore::Impl::MigrateSchema() {
  RECAL_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&db));
  int64_t version = 0;
  {
    RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("PRAGMA user_version"));
    RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
    if (row) version = q.Int64(0);
  }
  if (version == kSchemaVersion) return absl::OkStatus();  // rolls back the empty transaction
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "database '", db.path(), "' has schema version ", version, " but this recal-server knows only up to ",
        kSchemaVersion, "; run a newer server or point --data_dir elsewhere"));
  }
  if (version == 0) {  // a new (empty) database
    RECAL_RETURN_IF_ERROR(db.Exec(kTablesV2));
    RECAL_RETURN_IF_ERROR(db.Exec(kIndexesV2));
    RECAL_RETURN_IF_ERROR(db.Exec(kEventsAndResults));
    RECAL_RETURN_IF_ERROR(MigrateV2ToV3());
    RECAL_RETURN_IF_ERROR(MigrateV3ToV4());
  } else if (version == 1) {
    RECAL_RETURN_IF_ERROR(MigrateV1ToV2());  // straight to version 8's columns
  } else if (version == 2) {
    RECAL_RETURN_IF_ERROR(MigrateV2ToV3());
    RECAL_RETURN_IF_ERROR(MigrateV3ToV4());
  } else if (version == 3) {
    RECAL_RETURN_IF_ERROR(MigrateV3ToV4());
  }
  if (version < 5) RECAL_RETURN_IF_ERROR(MigrateV4ToV5());
  // Version 1 went straight to version 8's columns.
  if (version != 1 && version < 6) RECAL_RETURN_IF_ERROR(MigrateV5ToV6());
  if (version != 1 && version < 7) RECAL_RETURN_IF_ERROR(db.Exec(kModelsV7));
  if (version < 7) RECAL_RETURN_IF_ERROR(NumberModels());
  if (version != 1 && version < 8) RECAL_RETURN_IF_ERROR(MigrateV7ToV8());
  RECAL_RETURN_IF_ERROR(db.Exec(kReservationsV9));
  RECAL_RETURN_IF_ERROR(db.Exec(absl::StrCat("PRAGMA user_version = ", kSchemaVersion)));
  return txn.Commit();
}

absl::Status SqliteMetadataStore::Impl::MigrateV1ToV2() {
  RECAL_RETURN_IF_ERROR(db.Exec("DROP INDEX jobs_by_state; DROP INDEX jobs_by_model;"
                                "ALTER TABLE models RENAME TO models_v1; ALTER TABLE jobs RENAME TO jobs_v1;"));
  RECAL_RETURN_IF_ERROR(db.Exec(kTablesV2));
  RECAL_RETURN_IF_ERROR(db.Exec(kJobsV3));
  RECAL_RETURN_IF_ERROR(db.Exec(kJobsV4));
  RECAL_RETURN_IF_ERROR(db.Exec(kJobsV6));    // InsertJob writes created_ms
  RECAL_RETURN_IF_ERROR(db.Exec(kModelsV7));  // InsertModel writes name and version
  RECAL_RETURN_IF_ERROR(db.Exec(kJobsV8));    // InsertJob writes the plan
  {
    RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("SELECT id, proto FROM models_v1 ORDER BY create_seq"));
    while (true) {
      RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
      if (!row) break;
      RECAL_ASSIGN_OR_RETURN(v1::Model model, Parse<v1::Model>(q.Blob(1), "model", q.Text(0)));
      model.set_tenant(kDefaultTenant);
      RECAL_RETURN_IF_ERROR(InsertModel(model));
    }
  }
  {
    RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("SELECT id, proto FROM jobs_v1 ORDER BY create_seq"));
    while (true) {
      RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
      if (!row) break;
      RECAL_ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(q.Blob(1), "job", q.Text(0)));
      job.set_tenant(kDefaultTenant);
      RECAL_RETURN_IF_ERROR(InsertJob(job, "", std::nullopt));
    }
  }
  RECAL_RETURN_IF_ERROR(db.Exec("DROP TABLE models_v1; DROP TABLE jobs_v1;"));
  return db.Exec(kIndexesV2);
}

absl::Status SqliteMetadataStore::Impl::MigrateV2ToV3() {
  RECAL_RETURN_IF_ERROR(db.Exec(kJobsV3));
  // Waiting jobs are claimed by priority: give the column theirs.
  RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("SELECT id, proto FROM jobs WHERE state = ?1"));
  q.Bind(1, int64_t{v1::QUEUED});
  RECAL_ASSIGN_OR_RETURN(std::vector<v1::Job> queued, QueryJobs(q));
  for (const v1::Job& job : queued) {
    RECAL_ASSIGN_OR_RETURN(Query u, db.Prepare("UPDATE jobs SET priority = ?2 WHERE id = ?1"));
    RECAL_RETURN_IF_ERROR(u.Bind(1, job.id()).Bind(2, int64_t{job.spec().priority()}).Run());
  }
  return absl::OkStatus();
}

// Every existing job stays top-level and uncoordinated: the columns' defaults.
absl::Status SqliteMetadataStore::Impl::MigrateV3ToV4() { return db.Exec(kJobsV4); }

absl::Status SqliteMetadataStore::Impl::MigrateV4ToV5() { return db.Exec(kWorkerEndpointsV5); }

absl::Status SqliteMetadataStore::Impl::MigrateV5ToV6() { return db.Exec(kJobsV6); }

absl::Status SqliteMetadataStore::Impl::MigrateV7ToV8() { return db.Exec(kJobsV8); }

absl::Status SqliteMetadataStore::Impl::NumberModels() {
  std::vector<v1::Model> models;
  {
    RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("SELECT id, proto, tenant FROM models ORDER BY create_seq"));
    while (true) {
      RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
      if (!row) break;
      RECAL_ASSIGN_OR_RETURN(v1::Model model, Parse<v1::Model>(q.Blob(1), "model", q.Text(0)));
      model.set_tenant(q.Text(2));  // the column is the key; older protos may lack it
      models.push_back(std::move(model));
    }
  }
  for (const auto& [key, last] : NumberVersions(models)) {
    RECAL_RETURN_IF_ERROR(SetLastVersion(key.first, key.second, last));
  }
  for (const v1::Model& model : models) {
    RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("UPDATE models SET name = ?3, version = ?4, proto = ?5 "
                                               "WHERE tenant = ?1 AND id = ?2"));
    RECAL_RETURN_IF_ERROR(q.Bind(1, model.tenant())
                              .Bind(2, model.id())
                              .Bind(3, model.name())
                              .Bind(4, model.version())
                              .BindBlob(5, model.SerializeAsString())
                              .Run());
  }
  return db.Exec(kModelVersionsIndexV7);
}

absl::Status SqliteMetadataStore::Impl::InsertModel(const v1::Model& model) {
  RECAL_ASSIGN_OR_RETURN(Query q,
                         db.Prepare("INSERT OR IGNORE INTO models(tenant, id, create_seq, size, proto, name, version) "
                                    "VALUES(?1, ?2, (SELECT COALESCE(MAX(create_seq), 0) + 1 FROM models), "
                                    "?3, ?4, ?5, ?6)"));
  return q.Bind(1, model.tenant())
      .Bind(2, model.id())
      .Bind(3, model.size())
      .BindBlob(4, model.SerializeAsString())
      .Bind(5, model.name())
      .Bind(6, model.version())
      .Run();
}

absl::StatusOr<int64_t> SqliteMetadataStore::Impl::LastVersion(const std::string& tenant, const std::string& name) {
  RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("SELECT last_version FROM model_names WHERE tenant = ?1 AND name = ?2"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, tenant).Bind(2, name).Step());
  return row ? q.Int64(0) : 0;
}

absl::Status SqliteMetadataStore::Impl::SetLastVersion(const std::string& tenant, const std::string& name,
                                                       int64_t version) {
  RECAL_ASSIGN_OR_RETURN(Query q,
                         db.Prepare("INSERT INTO model_names(tenant, name, last_version) VALUES(?1, ?2, ?3) "
                                    "ON CONFLICT(tenant, name) DO UPDATE SET last_version = excluded.last_version"));
  return q.Bind(1, tenant).Bind(2, name).Bind(3, version).Run();
}

absl::StatusOr<std::optional<v1::Model>> SqliteMetadataStore::Impl::FindModel(const std::string& tenant,
                                                                              const std::string& id) {
  RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("SELECT proto FROM models WHERE tenant = ?1 AND id = ?2"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, tenant).Bind(2, id).Step());
  if (!row) return std::optional<v1::Model>();
  RECAL_ASSIGN_OR_RETURN(v1::Model model, Parse<v1::Model>(q.Blob(0), "model", id));
  return std::optional<v1::Model>(std::move(model));
}

absl::Status SqliteMetadataStore::Impl::InsertJob(const v1::Job& job, const std::string& plan,
                                                  std::optional<int64_t> created_ms) {
  RECAL_ASSIGN_OR_RETURN(
      Query q, db.Prepare("INSERT INTO jobs(id, tenant, request_id, state, model_id, create_seq, proto, priority, "
                          "parent_id, coordinated, created_ms, plan) "
                          "VALUES(?1, ?2, ?3, ?4, ?5, (SELECT COALESCE(MAX(create_seq), 0) + 1 FROM jobs), ?6, ?7, "
                          "?8, ?9, ?10, ?11)"));
  q.Bind(1, job.id()).Bind(2, job.tenant());
  if (created_ms) {
    q.Bind(10, *created_ms);
  } else {
    q.BindNull(10);
  }
  if (job.request_id().empty()) {
    q.BindNull(3);
  } else {
    q.Bind(3, job.request_id());
  }
  if (job.parent_id().empty()) {
    q.BindNull(8);
  } else {
    q.Bind(8, job.parent_id());
  }
  return q.Bind(4, int64_t{job.state()})
      .Bind(5, job.spec().model_id())
      .BindBlob(6, job.SerializeAsString())
      .Bind(7, int64_t{job.spec().priority()})
      .Bind(9, int64_t{IsCoordinated(job) ? 1 : 0})
      .BindBlob(11, plan)
      .Run();
}

absl::StatusOr<bool> SqliteMetadataStore::Impl::InsertNewJob(const v1::Job& job,
                                                             const std::vector<v1::JobEvent>& events,
                                                             const std::string& plan, int64_t created_ms) {
  RECAL_ASSIGN_OR_RETURN(const bool exists, JobExists(job.id()));
  if (exists) return false;
  RECAL_RETURN_IF_ERROR(InsertJob(job, plan, created_ms));
  for (const v1::JobEvent& event : events) RECAL_RETURN_IF_ERROR(InsertEvent(job.id(), event).status());
  return true;
}

absl::StatusOr<std::unique_ptr<SqliteMetadataStore>> SqliteMetadataStore::Open(const std::string& path) {
  RECAL_ASSIGN_OR_RETURN(Db db, Db::Open(path));
  // Other processes (sqlite3 CLI, backups) may hold the lock briefly; wait rather than fail.
  RECAL_RETURN_IF_ERROR(db.Exec("PRAGMA busy_timeout = 10000"));
  // WAL: readers never block the writer; FULL: a commit is on disk (WAL fsync'ed) when it
  // returns, which the job state machine relies on ("SUCCEEDED only when durable").
  {
    // Switching a new file to WAL fails at once with "database is locked", busy_timeout
    // notwithstanding, while another connection (a process opening it at the same time)
    // switches it: try again for as long as busy_timeout would wait.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("PRAGMA journal_mode = WAL"));
    absl::StatusOr<bool> stepped = q.Step();
    while (!stepped.ok() && absl::StrContains(stepped.status().message(), "database is locked") &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
      stepped = q.Step();
    }
    RECAL_ASSIGN_OR_RETURN(const bool row, std::move(stepped));
    if (!row || q.Text(0) != "wal") {
      return absl::FailedPreconditionError(absl::StrCat("cannot put database '", path, "' in WAL mode (got '",
                                                        row ? q.Text(0) : "",
                                                        "'); is it on a network file system?"));
    }
  }
  RECAL_RETURN_IF_ERROR(db.Exec("PRAGMA synchronous = FULL"));
  RECAL_RETURN_IF_ERROR(db.Exec("PRAGMA foreign_keys = OFF"));
  auto impl = std::make_unique<Impl>(std::move(db));
  RECAL_RETURN_IF_ERROR(impl->MigrateSchema());
  return std::unique_ptr<SqliteMetadataStore>(new SqliteMetadataStore(std::move(impl)));
}

SqliteMetadataStore::SqliteMetadataStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SqliteMetadataStore::~SqliteMetadataStore() = default;

// ------------------------------------------------------------------------------ models

absl::StatusOr<v1::Model> SqliteMetadataStore::PutModel(const v1::Model& model) {
  RECAL_RETURN_IF_ERROR(CheckNewModel(model));
  std::lock_guard<std::mutex> lock(impl_->mu);
  Db& db = impl_->db;
  // One write transaction (BEGIN IMMEDIATE) from the look-up to the insert: no other writer
  // can take the same bytes or the same version in between.
  RECAL_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&db));
  RECAL_RETURN_IF_ERROR(impl_->DeleteReservation(model.tenant(), UploadReservationOf(model)));
  RECAL_ASSIGN_OR_RETURN(std::optional<v1::Model> existing, impl_->FindModel(model.tenant(), model.id()));
  if (existing) {
    RECAL_RETURN_IF_ERROR(txn.Commit());
    return *std::move(existing);
  }
  const std::string name = StoredModelName(model);
  RECAL_ASSIGN_OR_RETURN(const int64_t last, impl_->LastVersion(model.tenant(), name));
  const v1::Model stored = AsNextVersion(model, last);
  RECAL_RETURN_IF_ERROR(impl_->InsertModel(stored));
  RECAL_RETURN_IF_ERROR(impl_->SetLastVersion(stored.tenant(), name, stored.version()));
  RECAL_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::StatusOr<v1::Model> SqliteMetadataStore::GetModel(const std::string& tenant, const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(std::optional<v1::Model> model, impl_->FindModel(tenant, id));
  if (!model) return absl::NotFoundError(absl::StrCat("no model '", id, "'"));
  return *std::move(model);
}

absl::StatusOr<v1::Model> SqliteMetadataStore::GetModelVersion(const std::string& tenant, const std::string& name,
                                                               int64_t version) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("SELECT id, proto FROM models WHERE tenant = ?1 AND name = ?2 "
                                                    "AND (?3 = 0 OR version = ?3) ORDER BY version DESC LIMIT 1"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, tenant).Bind(2, name).Bind(3, version).Step());
  if (!row) {
    return absl::NotFoundError(version == 0 ? absl::StrCat("no model named '", name, "'")
                                            : absl::StrCat("no version ", version, " of model '", name, "'"));
  }
  return Parse<v1::Model>(q.Blob(1), "model", q.Text(0));
}

absl::StatusOr<std::vector<v1::Model>> SqliteMetadataStore::FindModelsByDigestPrefix(const std::string& tenant,
                                                                                     const std::string& hex_prefix,
                                                                                     int limit) {
  const std::string prefix = absl::StrCat("sha256:", hex_prefix);
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("SELECT id, proto FROM models WHERE tenant = ?1 "
                                                    "AND substr(id, 1, ?2) = ?3 ORDER BY id LIMIT ?4"));
  q.Bind(1, tenant).Bind(2, static_cast<int64_t>(prefix.size())).Bind(3, prefix).Bind(4, int64_t{limit});
  std::vector<v1::Model> models;
  while (true) {
    RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
    if (!row) break;
    RECAL_ASSIGN_OR_RETURN(v1::Model model, Parse<v1::Model>(q.Blob(1), "model", q.Text(0)));
    models.push_back(std::move(model));
  }
  return models;
}

absl::StatusOr<bool> SqliteMetadataStore::ModelStoredByAnyTenant(const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("SELECT 1 FROM models WHERE id = ?1 LIMIT 1"));
  return q.Bind(1, id).Step();
}

absl::StatusOr<ModelPage> SqliteMetadataStore::ListModels(const std::string& tenant, int page_size,
                                                          const std::string& page_token, const std::string& name) {
  RECAL_ASSIGN_OR_RETURN(const int64_t below, DecodePageToken("models", page_token));
  const int limit = ClampPageSize(page_size);
  std::lock_guard<std::mutex> lock(impl_->mu);
  // Newest first, like ListJobs. One extra row tells whether there is a next page.
  RECAL_ASSIGN_OR_RETURN(
      Query q, impl_->db.Prepare("SELECT id, create_seq, proto FROM models WHERE (?1 = 0 OR create_seq < ?1) "
                                 "AND (?3 = '' OR tenant = ?3) AND (?4 = '' OR name = ?4) "
                                 "ORDER BY create_seq DESC LIMIT ?2"));
  q.Bind(1, below).Bind(2, int64_t{limit} + 1).Bind(3, tenant).Bind(4, name);
  ModelPage page;
  int64_t last_seq = 0;
  while (true) {
    RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
    if (!row) break;
    if (static_cast<int>(page.models.size()) == limit) {
      page.next_page_token = EncodePageToken("models", last_seq);
      break;
    }
    RECAL_ASSIGN_OR_RETURN(v1::Model m, Parse<v1::Model>(q.Blob(2), "model", q.Text(0)));
    page.models.push_back(std::move(m));
    last_seq = q.Int64(1);
  }
  return page;
}

absl::Status SqliteMetadataStore::DeleteModel(const std::string& tenant, const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("DELETE FROM models WHERE tenant = ?1 AND id = ?2"));
  RECAL_RETURN_IF_ERROR(q.Bind(1, tenant).Bind(2, id).Run());
  if (impl_->db.Changes() == 0) return absl::NotFoundError(absl::StrCat("no model '", id, "'"));
  return absl::OkStatus();
}

absl::StatusOr<bool> SqliteMetadataStore::Impl::ModelExists(const std::string& tenant, const std::string& id) {
  RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("SELECT 1 FROM models WHERE tenant = ?1 AND id = ?2"));
  return q.Bind(1, tenant).Bind(2, id).Step();
}

absl::StatusOr<int64_t> SqliteMetadataStore::Impl::CountActiveUsers(const std::string& tenant,
                                                                    const std::string& model_id) {
  // A shard still stopping under a parent that has ended needs the model too: counted as its
  // top-level job (once however many of its shards are active).
  RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("SELECT COUNT(DISTINCT COALESCE(parent_id, id)) FROM jobs "
                                             "WHERE model_id = ?1 AND tenant = ?2 AND state IN (?3, ?4, ?5)"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, model_id)
                                             .Bind(2, tenant)
                                             .Bind(3, int64_t{v1::QUEUED})
                                             .Bind(4, int64_t{v1::RUNNING})
                                             .Bind(5, int64_t{v1::CANCELLING})
                                             .Step());
  return row ? q.Int64(0) : 0;
}

absl::StatusOr<int64_t> SqliteMetadataStore::DeleteModelUnlessUsed(const std::string& tenant, const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  // BEGIN IMMEDIATE holds the write lock from the count to the delete: no CreateJob, in this
  // process or another, stores a job between them (it reads the model in its own write
  // transaction).
  RECAL_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&impl_->db));
  RECAL_ASSIGN_OR_RETURN(const bool exists, impl_->ModelExists(tenant, id));
  if (!exists) return absl::NotFoundError(absl::StrCat("no model '", id, "'"));
  RECAL_ASSIGN_OR_RETURN(const int64_t users, impl_->CountActiveUsers(tenant, id));
  if (users > 0) return users;  // rolls back: nothing written
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("DELETE FROM models WHERE tenant = ?1 AND id = ?2"));
  RECAL_RETURN_IF_ERROR(q.Bind(1, tenant).Bind(2, id).Run());
  RECAL_RETURN_IF_ERROR(txn.Commit());
  return 0;
}

absl::StatusOr<int64_t> SqliteMetadataStore::CountJobsUsingModel(const std::string& tenant, const std::string& model_id,
                                                           const std::vector<v1::JobState>& requested) {
  const std::optional<std::vector<v1::JobState>> states = NormalizeStates(requested);
  if (!states) return 0;
  std::string sql = "SELECT COUNT(*) FROM jobs WHERE model_id = ?1 AND tenant = ?2 AND parent_id IS NULL";
  if (!states->empty()) absl::StrAppend(&sql, " AND state IN ", Placeholders(3, states->size()));
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare(sql));
  q.Bind(1, model_id).Bind(2, tenant);
  BindStates(q, 3, *states);
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
  return row ? q.Int64(0) : 0;
}

// -------------------------------------------------------------------------------- jobs

absl::StatusOr<std::vector<v1::Job>> SqliteMetadataStore::Impl::QueryJobs(Query& q) {
  std::vector<v1::Job> jobs;
  while (true) {
    RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
    if (!row) break;
    RECAL_ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(q.Blob(1), "job", q.Text(0)));
    jobs.push_back(std::move(job));
  }
  return jobs;
}

absl::StatusOr<bool> SqliteMetadataStore::Impl::JobExists(const std::string& id) {
  RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("SELECT 1 FROM jobs WHERE id = ?1"));
  return q.Bind(1, id).Step();
}

absl::StatusOr<std::optional<v1::Job>> SqliteMetadataStore::Impl::JobWithRequestId(const std::string& tenant,
                                                                                 const std::string& request_id) {
  RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("SELECT id, proto FROM jobs WHERE tenant = ?1 AND request_id = ?2"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, tenant).Bind(2, request_id).Step());
  if (!row) return std::optional<v1::Job>();
  RECAL_ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(q.Blob(1), "job", q.Text(0)));
  return std::optional<v1::Job>(std::move(job));
}

absl::StatusOr<internal::TopLevelJobCounts> SqliteMetadataStore::Impl::CountTopLevelJobs(
    const std::string& tenant, int64_t created_after_ms) {
  RECAL_ASSIGN_OR_RETURN(
      Query q, db.Prepare("SELECT (SELECT COUNT(*) FROM jobs WHERE tenant = ?1 AND state IN (?2, ?3, ?4) "
                          "AND parent_id IS NULL), "
                          "(SELECT COUNT(*) FROM jobs WHERE tenant = ?1 AND created_ms > ?5 AND parent_id IS NULL)"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, tenant)
                                             .Bind(2, int64_t{v1::QUEUED})
                                             .Bind(3, int64_t{v1::RUNNING})
                                             .Bind(4, int64_t{v1::CANCELLING})
                                             .Bind(5, created_after_ms)
                                             .Step());
  if (!row) return absl::InternalError("counting a tenant's jobs returned no row");
  return internal::TopLevelJobCounts{q.Int64(0), q.Int64(1)};
}

absl::StatusOr<v1::Job> SqliteMetadataStore::CreateJob(const v1::Job& job, bool* created,
                                                       std::vector<v1::JobEvent> events,
                                                       std::vector<NewJob> children, const JobQuota& quota,
                                                       const std::string& plan) {
  RECAL_ASSIGN_OR_RETURN(const internal::JobCreation creation,
                         internal::JobCreation::Check(job, events, children, quota, plan));
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&impl_->db));
  RECAL_ASSIGN_OR_RETURN(internal::JobCreation::Outcome outcome, creation.StoreIn(*impl_));
  if (outcome.created) RECAL_RETURN_IF_ERROR(txn.Commit());  // otherwise it rolls back: nothing written
  if (created != nullptr) *created = outcome.created;
  return std::move(outcome.job);
}

absl::StatusOr<std::vector<v1::Job>> SqliteMetadataStore::ChildJobs(const std::string& parent_id) {
  std::vector<v1::Job> children;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    RECAL_ASSIGN_OR_RETURN(Query q,
                           impl_->db.Prepare("SELECT id, proto FROM jobs WHERE parent_id = ?1 ORDER BY create_seq"));
    q.Bind(1, parent_id);
    RECAL_ASSIGN_OR_RETURN(children, impl_->QueryJobs(q));
  }
  SortByShard(children);
  return children;
}

absl::StatusOr<v1::Job> SqliteMetadataStore::FindJobByRequestId(const std::string& tenant, const std::string& request_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(std::optional<v1::Job> job, impl_->JobWithRequestId(tenant, request_id));
  if (!job) return absl::NotFoundError(absl::StrCat("no job with request_id '", request_id, "'"));
  return *std::move(job);
}

absl::StatusOr<std::string> SqliteMetadataStore::JobPlan(const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("SELECT COALESCE(plan, X'') FROM jobs WHERE id = ?1"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, id).Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return q.Blob(0);
}

absl::StatusOr<v1::Job> SqliteMetadataStore::GetJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("SELECT proto FROM jobs WHERE id = ?1"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, id).Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return Parse<v1::Job>(q.Blob(0), "job", id);
}

absl::StatusOr<JobPage> SqliteMetadataStore::ListJobs(const std::string& tenant, const std::vector<v1::JobState>& requested,
                                                int page_size, const std::string& page_token) {
  RECAL_ASSIGN_OR_RETURN(const int64_t below, DecodePageToken("jobs", page_token));
  const std::optional<std::vector<v1::JobState>> states = NormalizeStates(requested);
  if (!states) return JobPage();
  const int limit = ClampPageSize(page_size);
  std::string sql =
      "SELECT id, proto, create_seq FROM jobs WHERE (?1 = 0 OR create_seq < ?1) AND (?3 = '' OR tenant = ?3) "
      "AND parent_id IS NULL";
  if (!states->empty()) absl::StrAppend(&sql, " AND state IN ", Placeholders(4, states->size()));
  absl::StrAppend(&sql, " ORDER BY create_seq DESC LIMIT ?2");
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare(sql));
  q.Bind(1, below).Bind(2, int64_t{limit} + 1).Bind(3, tenant);
  BindStates(q, 4, *states);
  JobPage page;
  int64_t last_seq = 0;
  while (true) {
    RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
    if (!row) break;
    if (static_cast<int>(page.jobs.size()) == limit) {
      page.next_page_token = EncodePageToken("jobs", last_seq);
      break;
    }
    RECAL_ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(q.Blob(1), "job", q.Text(0)));
    page.jobs.push_back(std::move(job));
    last_seq = q.Int64(2);
  }
  return page;
}

absl::StatusOr<std::vector<v1::Job>> SqliteMetadataStore::JobsInStates(const std::vector<v1::JobState>& requested) {
  const std::optional<std::vector<v1::JobState>> states = NormalizeStates(requested);
  if (!states) return std::vector<v1::Job>();
  std::string sql = "SELECT id, proto FROM jobs";
  if (!states->empty()) absl::StrAppend(&sql, " WHERE state IN ", Placeholders(1, states->size()));
  absl::StrAppend(&sql, " ORDER BY create_seq ASC");
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare(sql));
  BindStates(q, 1, *states);
  return impl_->QueryJobs(q);
}

// ------------------------------------------------------------------------------ events

absl::StatusOr<v1::JobEvent> SqliteMetadataStore::Impl::InsertEvent(const std::string& job_id, v1::JobEvent event) {
  int64_t last = 0;
  {
    RECAL_ASSIGN_OR_RETURN(Query q,
                                 db.Prepare("SELECT COALESCE(MAX(seq), 0) FROM events WHERE job_id = ?1"));
    RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, job_id).Step());
    if (row) last = q.Int64(0);
  }
  event.set_seq(last + 1);
  SetNow(event.mutable_time());
  RECAL_ASSIGN_OR_RETURN(Query q,
                               db.Prepare("INSERT INTO events(job_id, seq, proto) VALUES(?1, ?2, ?3)"));
  RECAL_RETURN_IF_ERROR(
      q.Bind(1, job_id).Bind(2, event.seq()).BindBlob(3, event.SerializeAsString()).Run());
  return event;
}

absl::Status SqliteMetadataStore::Impl::WriteJob(const v1::Job& job, int64_t expected_version) {
  // request_id and create_seq are fixed at creation; the state column follows the proto; a
  // job that is not running holds no lease.
  RECAL_ASSIGN_OR_RETURN(
      Query q, db.Prepare("UPDATE jobs SET state = ?2, model_id = ?3, proto = ?4, priority = ?5, version = version + 1, "
                          "lease_owner = CASE WHEN ?2 IN (?7, ?8) THEN lease_owner END, "
                          "lease_until_ms = CASE WHEN ?2 IN (?7, ?8) THEN lease_until_ms END "
                          "WHERE id = ?1 AND (?6 < 0 OR version = ?6)"));
  RECAL_RETURN_IF_ERROR(q.Bind(1, job.id())
                            .Bind(2, int64_t{job.state()})
                            .Bind(3, job.spec().model_id())
                            .BindBlob(4, job.SerializeAsString())
                            .Bind(5, int64_t{job.spec().priority()})
                            .Bind(6, expected_version)
                            .Bind(7, int64_t{v1::RUNNING})
                            .Bind(8, int64_t{v1::CANCELLING})
                            .Run());
  if (db.Changes() > 0) {
    if (HoldsWorker(job.state())) return absl::OkStatus();
    return DeleteReservation(job.tenant(), ResultsReservationKey(job.id()));
  }
  RECAL_ASSIGN_OR_RETURN(const bool exists, JobExists(job.id()));
  if (!exists) return absl::NotFoundError(absl::StrCat("no job '", job.id(), "' to update"));
  return absl::AbortedError(absl::StrCat("job ", job.id(), " changed meanwhile (version ", expected_version, " is gone)"));
}

absl::Status SqliteMetadataStore::Impl::InsertResult(const std::string& job_id, v1::Artifact artifact,
                                               const ResultRef& ref) {
  if (artifact == v1::ARTIFACT_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat("result of job '", job_id, "' needs an artifact kind"));
  }
  RECAL_ASSIGN_OR_RETURN(
      Query q, db.Prepare("INSERT OR REPLACE INTO results(job_id, artifact, sha256, size) VALUES(?1, ?2, ?3, ?4)"));
  return q.Bind(1, job_id).Bind(2, int64_t{artifact}).Bind(3, ref.sha256).Bind(4, ref.size).Run();
}

absl::StatusOr<v1::JobEvent> SqliteMetadataStore::UpdateJob(const v1::Job& job, v1::JobEvent event) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&impl_->db));
  RECAL_RETURN_IF_ERROR(impl_->WriteJob(job));
  RECAL_ASSIGN_OR_RETURN(v1::JobEvent stored, impl_->InsertEvent(job.id(), std::move(event)));
  RECAL_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::Status SqliteMetadataStore::CommitJob(const v1::Job& job, std::vector<v1::JobEvent> events,
                                      const std::map<v1::Artifact, ResultRef>& results, int64_t expected_version) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&impl_->db));
  RECAL_RETURN_IF_ERROR(impl_->WriteJob(job, expected_version));
  for (const auto& [artifact, ref] : results) RECAL_RETURN_IF_ERROR(impl_->InsertResult(job.id(), artifact, ref));
  for (v1::JobEvent& event : events) RECAL_RETURN_IF_ERROR(impl_->InsertEvent(job.id(), std::move(event)).status());
  return txn.Commit();
}

absl::StatusOr<v1::JobEvent> SqliteMetadataStore::AppendEvent(const std::string& job_id, v1::JobEvent event) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&impl_->db));
  RECAL_ASSIGN_OR_RETURN(const bool exists, impl_->JobExists(job_id));
  if (!exists) return absl::NotFoundError(absl::StrCat("no job '", job_id, "' to add an event to"));
  RECAL_ASSIGN_OR_RETURN(v1::JobEvent stored, impl_->InsertEvent(job_id, std::move(event)));
  RECAL_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

absl::StatusOr<std::vector<v1::JobEvent>> SqliteMetadataStore::EventsAfter(const std::string& job_id,
                                                                     int64_t after_seq, int limit) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<v1::JobEvent> events;
  {
    RECAL_ASSIGN_OR_RETURN(
        Query q,
        impl_->db.Prepare("SELECT proto FROM events WHERE job_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"));
    // LIMIT -1 is SQLite for "no limit".
    q.Bind(1, job_id).Bind(2, after_seq).Bind(3, limit > 0 ? int64_t{limit} : int64_t{-1});
    while (true) {
      RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
      if (!row) break;
      RECAL_ASSIGN_OR_RETURN(v1::JobEvent e, Parse<v1::JobEvent>(q.Blob(0), "event of job", job_id));
      events.push_back(std::move(e));
    }
  }
  // Only an empty answer needs the extra look-up: "no events yet" differs from "no job".
  if (events.empty()) {
    RECAL_ASSIGN_OR_RETURN(const bool exists, impl_->JobExists(job_id));
    if (!exists) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  }
  return events;
}

// ----------------------------------------------------------------------------- results

absl::Status SqliteMetadataStore::PutResult(const std::string& job_id, v1::Artifact artifact,
                                      const ResultRef& ref) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&impl_->db));
  RECAL_ASSIGN_OR_RETURN(const bool exists, impl_->JobExists(job_id));
  if (!exists) return absl::NotFoundError(absl::StrCat("no job '", job_id, "' to store a result for"));
  RECAL_RETURN_IF_ERROR(impl_->InsertResult(job_id, artifact, ref));
  return txn.Commit();
}

absl::StatusOr<ResultRef> SqliteMetadataStore::GetResult(const std::string& job_id, v1::Artifact artifact) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(
      Query q, impl_->db.Prepare("SELECT sha256, size FROM results WHERE job_id = ?1 AND artifact = ?2"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, job_id).Bind(2, int64_t{artifact}).Step());
  if (!row) {
    return absl::NotFoundError(
        absl::StrCat("job '", job_id, "' has no ", v1::Artifact_Name(artifact), " result"));
  }
  ResultRef ref;
  ref.sha256 = q.Text(0);
  ref.size = q.Int64(1);
  return ref;
}

absl::StatusOr<bool> SqliteMetadataStore::BlobReferenced(const std::string& sha256) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("SELECT 1 FROM results WHERE sha256 = ?1 LIMIT 1"));
  return q.Bind(1, sha256).Step();
}

absl::StatusOr<TenantUsage> SqliteMetadataStore::Impl::CountUsage(const std::string& tenant,
                                                                  const std::string& except_key) {
  RECAL_ASSIGN_OR_RETURN(
      Query q, db.Prepare("SELECT (SELECT COUNT(*) FROM jobs WHERE tenant = ?1 AND state IN (?2, ?3, ?4) "
                          "AND parent_id IS NULL), "
                          "(SELECT COUNT(*) FROM models WHERE tenant = ?1), "
                          "(SELECT COALESCE(SUM(size), 0) FROM models WHERE tenant = ?1), "
                          "(SELECT COUNT(*) FROM results r JOIN jobs j ON r.job_id = j.id WHERE j.tenant = ?1), "
                          "(SELECT COALESCE(SUM(r.size), 0) FROM results r JOIN jobs j ON r.job_id = j.id "
                          "WHERE j.tenant = ?1), "
                          "(SELECT COUNT(*) FROM reservations WHERE tenant = ?1 AND key <> ?5), "
                          "(SELECT COALESCE(SUM(bytes), 0) FROM reservations WHERE tenant = ?1 AND key <> ?5)"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, tenant)
                                             .Bind(2, int64_t{v1::QUEUED})
                                             .Bind(3, int64_t{v1::RUNNING})
                                             .Bind(4, int64_t{v1::CANCELLING})
                                             .Bind(5, except_key)
                                             .Step());
  TenantUsage usage;
  if (!row) return usage;
  usage.active_jobs = q.Int64(0);
  usage.models = q.Int64(1);
  usage.model_bytes = q.Int64(2);
  usage.results = q.Int64(3);
  usage.result_bytes = q.Int64(4);
  usage.reservations = q.Int64(5);
  usage.reserved_bytes = q.Int64(6);
  usage.stored_bytes = usage.model_bytes + usage.result_bytes + usage.reserved_bytes;
  return usage;
}

absl::StatusOr<TenantUsage> SqliteMetadataStore::Usage(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->CountUsage(tenant);
}

// ------------------------------------------------------------------------ reservations

absl::Status SqliteMetadataStore::Impl::DeleteReservation(const std::string& tenant, const std::string& key) {
  RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("DELETE FROM reservations WHERE tenant = ?1 AND key = ?2"));
  return q.Bind(1, tenant).Bind(2, key).Run();
}

absl::StatusOr<ReserveOutcome> SqliteMetadataStore::Reserve(const Reservation& r, int64_t limit, int64_t now_ms) {
  RECAL_RETURN_IF_ERROR(CheckReservation(r));
  std::lock_guard<std::mutex> lock(impl_->mu);
  // The write lock from the count to the insert: no other writer, in this process or another,
  // reserves or stores between them.
  RECAL_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&impl_->db));
  ReserveOutcome outcome;
  RECAL_ASSIGN_OR_RETURN(outcome.usage_before, impl_->CountUsage(r.tenant, r.key));
  outcome.granted = Fits(outcome.usage_before, r.bytes, limit);
  if (!outcome.granted) return outcome;  // rolls back: nothing written
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("INSERT INTO reservations(tenant, key, bytes, touched_ms) "
                                                    "VALUES(?1, ?2, ?3, ?4) ON CONFLICT(tenant, key) DO UPDATE "
                                                    "SET bytes = excluded.bytes, touched_ms = excluded.touched_ms"));
  RECAL_RETURN_IF_ERROR(q.Bind(1, r.tenant).Bind(2, r.key).Bind(3, r.bytes).Bind(4, now_ms).Run());
  RECAL_RETURN_IF_ERROR(txn.Commit());
  return outcome;
}

absl::StatusOr<bool> SqliteMetadataStore::TouchReservation(const std::string& tenant, const std::string& key,
                                                           int64_t now_ms) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  int64_t touched_ms = 0;
  {
    RECAL_ASSIGN_OR_RETURN(Query q,
                           impl_->db.Prepare("SELECT touched_ms FROM reservations WHERE tenant = ?1 AND key = ?2"));
    RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, tenant).Bind(2, key).Step());
    if (!row) return false;
    touched_ms = q.Int64(0);
  }
  // Reads are cheap; a write (a WAL fsync) is made once a minute at most.
  if (!TouchIsDue(touched_ms, now_ms)) return true;
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("UPDATE reservations SET touched_ms = ?3 "
                                                    "WHERE tenant = ?1 AND key = ?2"));
  RECAL_RETURN_IF_ERROR(q.Bind(1, tenant).Bind(2, key).Bind(3, now_ms).Run());
  return impl_->db.Changes() > 0;
}

absl::Status SqliteMetadataStore::ReleaseReservation(const std::string& tenant, const std::string& key) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->DeleteReservation(tenant, key);
}

absl::StatusOr<int64_t> SqliteMetadataStore::ExpireReservations(int64_t touched_before_ms) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("DELETE FROM reservations WHERE touched_ms < ?1"));
  RECAL_RETURN_IF_ERROR(q.Bind(1, touched_before_ms).Run());
  return impl_->db.Changes();
}

// ----------------------------------------------------------------------------- workers

absl::StatusOr<StoredJob> SqliteMetadataStore::ReadJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(
      Query q, impl_->db.Prepare("SELECT proto, version, COALESCE(lease_owner, ''), COALESCE(lease_until_ms, 0) "
                                 "FROM jobs WHERE id = ?1"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, id).Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  StoredJob stored;
  RECAL_ASSIGN_OR_RETURN(stored.job, Parse<v1::Job>(q.Blob(0), "job", id));
  stored.version = q.Int64(1);
  stored.lease_owner = q.Text(2);
  stored.lease_until_ms = q.Int64(3);
  return stored;
}

absl::StatusOr<std::vector<ResultRef>> SqliteMetadataStore::DeleteJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Db& db = impl_->db;
  RECAL_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&db));
  {
    RECAL_ASSIGN_OR_RETURN(
        Query q, db.Prepare("SELECT state, COALESCE(parent_id, ''), (SELECT COUNT(*) FROM jobs c WHERE c.parent_id = "
                            "?1 AND c.state NOT IN (?2, ?3, ?4)) FROM jobs WHERE id = ?1"));
    RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, id)
                                               .Bind(2, int64_t{v1::SUCCEEDED})
                                               .Bind(3, int64_t{v1::FAILED})
                                               .Bind(4, int64_t{v1::CANCELLED})
                                               .Step());
    if (!row) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
    RECAL_RETURN_IF_ERROR(CheckDeletable(id, static_cast<v1::JobState>(q.Int64(0)), q.Text(1), q.Int64(2)));
  }
  // The job and its shards, in one set every statement below names.
  constexpr char kFamily[] = "(SELECT id FROM jobs WHERE id = ?1 OR parent_id = ?1)";
  std::vector<ResultRef> results;
  {
    RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare(absl::StrCat("SELECT sha256, size FROM results WHERE job_id IN ",
                                                            kFamily)));
    q.Bind(1, id);
    while (true) {
      RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
      if (!row) break;
      results.push_back(ResultRef{q.Text(0), q.Int64(1)});
    }
  }
  for (const char* table : {"results", "events"}) {
    RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare(absl::StrCat("DELETE FROM ", table, " WHERE job_id IN ", kFamily)));
    RECAL_RETURN_IF_ERROR(q.Bind(1, id).Run());
  }
  RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("DELETE FROM jobs WHERE id = ?1 OR parent_id = ?1"));
  RECAL_RETURN_IF_ERROR(q.Bind(1, id).Run());
  RECAL_RETURN_IF_ERROR(txn.Commit());
  return results;
}

absl::StatusOr<std::set<std::string>> SqliteMetadataStore::Impl::TenantsAtRunningBound(
    const MaxRunningJobs& max_running) {
  std::set<std::string> at_bound;
  RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("SELECT tenant, COUNT(*) FROM jobs WHERE state IN (?1, ?2) "
                                             "AND coordinated = 0 GROUP BY tenant"));
  q.Bind(1, int64_t{kHoldingWorker[0]}).Bind(2, int64_t{kHoldingWorker[1]});
  while (true) {
    RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
    if (!row) break;
    if (AtRunningBound(max_running, q.Text(0), q.Int64(1))) at_bound.insert(q.Text(0));
  }
  return at_bound;
}

absl::StatusOr<std::optional<v1::Job>> SqliteMetadataStore::ClaimJob(const std::string& owner, int64_t lease_until_ms,
                                                                     const ClaimChange& change, ClaimKind kind,
                                                                     const MaxRunningJobs& max_running) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Db& db = impl_->db;
  // The connection's mutex and the write transaction make the count, the pick and the update
  // one step: no other claim, here or in another process on the file, comes between.
  RECAL_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&db));
  std::set<std::string> at_bound;
  if (kind == ClaimKind::kRun && max_running) {
    RECAL_ASSIGN_OR_RETURN(at_bound, impl_->TenantsAtRunningBound(max_running));
  }
  std::string id, bytes;
  {
    // In claim order; the first job whose tenant may have another worker.
    RECAL_ASSIGN_OR_RETURN(
        Query q, db.Prepare("SELECT id, tenant, proto FROM jobs j WHERE state = ?1 AND coordinated = ?2 "
                            "ORDER BY priority DESC, "
                            "(SELECT COALESCE(MAX(started_ms), -1) FROM jobs t WHERE t.tenant = j.tenant) ASC, "
                            "create_seq ASC"));
    q.Bind(2, int64_t{kind == ClaimKind::kCoordinate ? 1 : 0});
    q.Bind(1, int64_t{v1::QUEUED});
    while (id.empty()) {
      RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
      if (!row) return std::optional<v1::Job>();
      if (at_bound.count(q.Text(1)) > 0) continue;
      id = q.Text(0);
      bytes = q.Blob(2);
    }
  }
  RECAL_ASSIGN_OR_RETURN(v1::Job job, Parse<v1::Job>(bytes, "job", id));
  std::vector<v1::JobEvent> events;
  RECAL_RETURN_IF_ERROR(change(job, events));
  RECAL_RETURN_IF_ERROR(impl_->WriteJob(job));
  {
    RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("UPDATE jobs SET lease_owner = ?2, lease_until_ms = ?3, started_ms = ?4 "
                                               "WHERE id = ?1"));
    RECAL_RETURN_IF_ERROR(
        q.Bind(1, id).Bind(2, owner).Bind(3, lease_until_ms).Bind(4, absl::ToUnixMillis(absl::Now())).Run());
  }
  for (v1::JobEvent& event : events) RECAL_RETURN_IF_ERROR(impl_->InsertEvent(id, std::move(event)).status());
  RECAL_RETURN_IF_ERROR(txn.Commit());
  return std::optional<v1::Job>(std::move(job));
}

absl::StatusOr<QueueCounts> SqliteMetadataStore::CountQueue(const std::string& id, int64_t heard_since_ms,
                                                            int64_t now_ms) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(
      Query q, impl_->db.Prepare(
                   "SELECT (SELECT COUNT(*) FROM jobs a WHERE a.state = ?2 AND a.coordinated = j.coordinated AND "
                   "(a.priority > j.priority OR (a.priority = j.priority AND a.create_seq < j.create_seq))), "
                   "(SELECT COUNT(*) FROM jobs r WHERE r.tenant = j.tenant AND r.state IN (?3, ?4) "
                   "AND r.coordinated = 0), "
                   "(SELECT COUNT(*) FROM jobs r WHERE r.state IN (?3, ?4) AND r.coordinated = 0), "
                   "(SELECT COUNT(*) FROM (SELECT owner FROM worker_endpoints WHERE updated_ms >= ?5 UNION "
                   "SELECT lease_owner FROM jobs WHERE state IN (?3, ?4) AND lease_until_ms >= ?6)) "
                   "FROM jobs j WHERE j.id = ?1"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, id)
                                             .Bind(2, int64_t{v1::QUEUED})
                                             .Bind(3, int64_t{kHoldingWorker[0]})
                                             .Bind(4, int64_t{kHoldingWorker[1]})
                                             .Bind(5, heard_since_ms)
                                             .Bind(6, now_ms)
                                             .Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return QueueCounts{q.Int64(0), q.Int64(1), q.Int64(2), q.Int64(3)};
}

absl::StatusOr<v1::JobState> SqliteMetadataStore::RenewLease(const std::string& job_id, const std::string& owner,
                                                             int64_t lease_until_ms) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Db& db = impl_->db;
  {
    RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("UPDATE jobs SET lease_until_ms = ?3 WHERE id = ?1 AND "
                                               "lease_owner = ?2 AND state IN (?4, ?5)"));
    RECAL_RETURN_IF_ERROR(q.Bind(1, job_id)
                              .Bind(2, owner)
                              .Bind(3, lease_until_ms)
                              .Bind(4, int64_t{v1::RUNNING})
                              .Bind(5, int64_t{v1::CANCELLING})
                              .Run());
  }
  if (db.Changes() == 0) {
    return absl::FailedPreconditionError(absl::StrCat("the lease on job ", job_id, " is not ", owner, "'s any more"));
  }
  RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("SELECT state FROM jobs WHERE id = ?1"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, job_id).Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return static_cast<v1::JobState>(q.Int64(0));
}

absl::StatusOr<std::vector<StoredJob>> SqliteMetadataStore::JobsWithExpiredLeases(int64_t now_ms) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(
      Query q, impl_->db.Prepare("SELECT id, proto, version, COALESCE(lease_owner, ''), COALESCE(lease_until_ms, 0) "
                                 "FROM jobs WHERE state IN (?1, ?2) AND COALESCE(lease_until_ms, 0) < ?3 "
                                 "ORDER BY create_seq"));
  q.Bind(1, int64_t{v1::RUNNING}).Bind(2, int64_t{v1::CANCELLING}).Bind(3, now_ms);
  std::vector<StoredJob> expired;
  while (true) {
    RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
    if (!row) break;
    StoredJob stored;
    RECAL_ASSIGN_OR_RETURN(stored.job, Parse<v1::Job>(q.Blob(1), "job", q.Text(0)));
    stored.version = q.Int64(2);
    stored.lease_owner = q.Text(3);
    stored.lease_until_ms = q.Int64(4);
    expired.push_back(std::move(stored));
  }
  return expired;
}

absl::StatusOr<int64_t> SqliteMetadataStore::CountJobsInStates(const std::vector<v1::JobState>& requested) {
  const std::optional<std::vector<v1::JobState>> states = NormalizeStates(requested);
  if (!states) return 0;
  std::string sql = "SELECT COUNT(*) FROM jobs WHERE parent_id IS NULL";
  if (!states->empty()) absl::StrAppend(&sql, " AND state IN ", Placeholders(1, states->size()));
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare(sql));
  BindStates(q, 1, *states);
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
  return row ? q.Int64(0) : 0;
}

// ------------------------------------------------------------------ worker endpoints

absl::Status SqliteMetadataStore::PutWorkerEndpoint(const std::string& owner, const std::string& address,
                                                    int64_t now_ms) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Db& db = impl_->db;
  RECAL_ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(&db));
  {
    RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("INSERT INTO worker_endpoints(owner, address, updated_ms) "
                                               "VALUES(?1, ?2, ?3) ON CONFLICT(owner) DO UPDATE SET "
                                               "address = excluded.address, updated_ms = excluded.updated_ms"));
    RECAL_RETURN_IF_ERROR(q.Bind(1, owner).Bind(2, address).Bind(3, now_ms).Run());
  }
  {
    RECAL_ASSIGN_OR_RETURN(Query q, db.Prepare("DELETE FROM worker_endpoints WHERE updated_ms < ?1 AND owner NOT IN "
                                               "(SELECT lease_owner FROM jobs WHERE lease_owner IS NOT NULL)"));
    RECAL_RETURN_IF_ERROR(q.Bind(1, now_ms - kForgetWorkerEndpointAfterMs).Run());
  }
  return txn.Commit();
}

absl::StatusOr<std::string> SqliteMetadataStore::WorkerEndpoint(const std::string& owner) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("SELECT address FROM worker_endpoints WHERE owner = ?1"));
  RECAL_ASSIGN_OR_RETURN(const bool row, q.Bind(1, owner).Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no internal endpoint recorded for worker ", owner));
  return q.Text(0);
}

absl::StatusOr<std::vector<std::string>> SqliteMetadataStore::LiveWorkerEndpoints(int64_t heard_since_ms) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RECAL_ASSIGN_OR_RETURN(Query q, impl_->db.Prepare("SELECT address, MAX(updated_ms) AS heard FROM worker_endpoints "
                                                    "WHERE updated_ms >= ?1 GROUP BY address ORDER BY heard DESC"));
  q.Bind(1, heard_since_ms);
  std::vector<std::string> addresses;
  while (true) {
    RECAL_ASSIGN_OR_RETURN(const bool row, q.Step());
    if (!row) break;
    addresses.push_back(q.Text(0));
  }
  return addresses;
}

}  // namespace recal::store
