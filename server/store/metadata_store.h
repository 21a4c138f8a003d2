// The durable metadata: models, jobs, job events and result references. Two backends behind
// one interface and one conformance suite (tests/store/metadata_store_test.cc): SQLite (the
// embedded default, one process) and PostgreSQL (the cluster mode). Messages are stored as
// serialized protobufs next to the columns that are queried. Implementations are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "recal/v1/recal.pb.h"

namespace recal::store {

struct ResultRef {
  std::string sha256;  // hex digest of the blob
  int64_t size = 0;
};

struct JobPage {
  std::vector<v1::Job> jobs;
  std::string next_page_token;  // empty at the end
};

// What a tenant holds, for its quotas and GetUsage. Results count per artifact stored, of
// its jobs and their shards; bytes as the rows record them (a blob two rows share counts twice).
struct TenantUsage {
  int64_t active_jobs = 0;   // QUEUED, RUNNING or CANCELLING
  int64_t stored_bytes = 0;  // model_bytes + result_bytes + reserved_bytes
  int64_t models = 0;
  int64_t model_bytes = 0;
  int64_t results = 0;
  int64_t result_bytes = 0;
  int64_t reservations = 0;  // Reservation rows: uploads in progress, results being stored
  int64_t reserved_bytes = 0;
};

// Bytes a tenant is about to store, counted against its max_stored_bytes from before the
// first of them is written until the row that records them is: an upload's whole declared
// size from its first byte until its model is stored (PutModel drops the reservation in the
// transaction that writes the model row) or it is refused; a job's results from before they
// enter the blob store until the job's row leaves RUNNING (CommitJob, UpdateJob: in the
// transaction that stores the results). So bytes on their way are never counted nowhere,
// and two writers racing for a tenant's last bytes never both get them (Reserve).
struct Reservation {
  std::string tenant;
  std::string key;  // UploadReservationKey or ResultsReservationKey
  int64_t bytes = 0;
};
std::string UploadReservationKey(const std::string& sha256_hex);
std::string ResultsReservationKey(const std::string& job_id);

// What Reserve found: whether the bytes were reserved, and the tenant's usage as counted in
// its transaction without them (nor what the key held before), for the refusal's message.
struct ReserveOutcome {
  bool granted = false;
  TenantUsage usage_before;
};

// A reservation's touch time need only be this fresh (TouchReservation writes at most this
// often): what expires reservations allows for it.
inline constexpr absl::Duration kReservationTouchEvery = absl::Minutes(1);

// A tenant's submission quotas (0: no limit), which CreateJob checks in the transaction that
// stores the job: counted in the store, they hold across every process on it (api replicas
// behind a load balancer), not per process.
struct JobQuota {
  int64_t max_active_jobs = 0;             // top-level jobs QUEUED, RUNNING or CANCELLING
  int64_t max_submissions_per_minute = 0;  // top-level jobs created in the minute before now_ms
  // When the job is submitted (Unix ms): stored as its creation time, and the end of the
  // minute counted. 0: the store's clock.
  int64_t now_ms = 0;
  // Not a limit but checked with them: the job's spec.model_id must be one of the tenant's
  // stored models, read in the transaction that stores the job (NOT_FOUND otherwise), so
  // that a model deleted at the same time (DeleteModelUnlessUsed, the retention sweeper)
  // either is seen by the job, and stays, or the job is not stored.
  bool model_must_exist = false;
};

// The tenant of everything made while authentication is off, and of all rows a database
// from before tenants had.
inline constexpr char kDefaultTenant[] = "default";

// The name of a model uploaded without one, and of models stored before models had names
// (schema version 7).
inline constexpr char kDefaultModelName[] = "model";

// How long a worker endpoint nobody refreshed, whose owner holds no lease, is kept.
inline constexpr int64_t kForgetWorkerEndpointAfterMs = int64_t{7} * 24 * 3600 * 1000;

// How often a worker process puts its endpoint (relay/endpoint_heartbeat.h), and how recently
// it must have done so to count as up (for api replicas' inspections, and for a queued job's
// JobWait): three heartbeats and some, so that one slow store write does not hide it.
inline constexpr absl::Duration kWorkerEndpointHeartbeat = absl::Seconds(10);
inline constexpr absl::Duration kWorkerEndpointLiveWithin = absl::Seconds(35);

// A job as the store holds it: the message, the version every write bumps (for
// compare-and-set across processes) and the lease of the worker running it, if any.
struct StoredJob {
  v1::Job job;
  int64_t version = 0;
  std::string lease_owner;   // empty: no lease
  int64_t lease_until_ms = 0;  // Unix ms
};

// What a claim does to the job it picked (inside the claim's transaction): the state
// machine's QUEUED -> RUNNING, and the events to store with it.
using ClaimChange = std::function<absl::Status(v1::Job&, std::vector<v1::JobEvent>&)>;

// A job stored together with another (the shards of a sharded job, with their parent).
struct NewJob {
  v1::Job job;
  std::vector<v1::JobEvent> events;
  // Stored with the job's row, as CreateJob's `plan` is with its job: a shard's is its
  // parent's plan.
  std::string plan;
};

// Which queued jobs a claimer takes: jobs that run on a worker (plain jobs and the shards of
// sharded jobs), or sharded jobs, whose run is coordinating their shards and merging them.
enum class ClaimKind { kRun, kCoordinate };

// Whether a job is the parent of shards (its run coordinates them).
inline bool IsCoordinated(const v1::Job& job) { return job.parent_id().empty() && job.spec().shards() > 1; }

// The most jobs of `tenant` that may hold a worker at once (0: no bound but the workers). A
// job holds one from its claim until it ends: RUNNING or CANCELLING, plain jobs and shards
// alike; a sharded job's parent holds none (a coordinator thread runs it, not a worker).
using MaxRunningJobs = std::function<int64_t(const std::string& tenant)>;

// What a QUEUED job waits behind (v1::JobWait), counted in one read.
struct QueueCounts {
  // QUEUED jobs of every tenant, of the job's ClaimKind, with a higher priority or the same
  // and an earlier creation (the claim order without its turns between tenants).
  int64_t jobs_ahead = 0;
  // Jobs of the job's tenant, and of every tenant, that hold a worker (MaxRunningJobs).
  int64_t tenant_running = 0;
  int64_t jobs_running = 0;
  // Worker processes heard from: owners of an endpoint put at or after `heard_since_ms`, or of
  // a lease on a running job that lasts until `now_ms` or later (a worker without an internal
  // endpoint puts none, but renews its leases).
  int64_t workers_heard = 0;
};

struct ModelPage {
  std::vector<v1::Model> models;
  std::string next_page_token;
};

// Held while changes are to be reported; destroying it stops the reports (and waits for one
// in progress).
class ChangeWatch {
 public:
  virtual ~ChangeWatch() = default;
};

class MetadataStore {
 public:
  virtual ~MetadataStore() = default;

  // Calls `on_change` (on a thread of its own) whenever a job changes in any process on this
  // store, and after any gap in which changes may have been missed, until the handle goes.
  // nullptr: this backend cannot tell other processes' changes (SQLite; watchers poll).
  virtual std::unique_ptr<ChangeWatch> WatchChanges(std::function<void()> on_change) { return nullptr; }
  // Models, keyed by tenant and id ("sha256:<hex>": one row per tenant and bytes), each with
  // a name and a version under it (unique per tenant; docs/models.md).
  // PutModel keeps the stored model if the tenant has these bytes already (the first name,
  // version and metadata win). Otherwise it stores the model as the next version of its name
  // (an empty name: kDefaultModelName): one more than the highest version the name ever had
  // in the tenant, so that a number is never reused, also after deletions; model.version is
  // ignored. Returns the model as stored. Either way the tenant's upload reservation of these
  // bytes (UploadReservationKey) goes in the same transaction: they count as the model now.
  virtual absl::StatusOr<v1::Model> PutModel(const v1::Model& model) = 0;
  virtual absl::StatusOr<v1::Model> GetModel(const std::string& tenant, const std::string& id) = 0;  // NOT_FOUND
  // The tenant's model `name` at `version`, or its latest version when `version` is 0
  // (NOT_FOUND if it has none).
  virtual absl::StatusOr<v1::Model> GetModelVersion(const std::string& tenant, const std::string& name,
                                                    int64_t version) = 0;
  // The tenant's models whose id starts with "sha256:" + `hex_prefix`, by id, at most `limit`.
  virtual absl::StatusOr<std::vector<v1::Model>> FindModelsByDigestPrefix(const std::string& tenant,
                                                                          const std::string& hex_prefix,
                                                                          int limit) = 0;
  // Newest first. `tenant` empty: every tenant's; `name` not empty: that name's versions only.
  virtual absl::StatusOr<ModelPage> ListModels(const std::string& tenant, int page_size, const std::string& page_token,
                                               const std::string& name) = 0;
  virtual absl::Status DeleteModel(const std::string& tenant, const std::string& id) = 0;  // NOT_FOUND
  // Deletes the tenant's model unless a job of the tenant that uses it is queued, running or
  // cancelling (or has a shard that is), decided in the transaction that deletes it (a CreateJob with
  // model_must_exist at the same time either sees the model, which then stays, or fails).
  // Returns how many such top-level jobs there are: 0 when it deleted the model, else
  // nothing changed. NOT_FOUND if the tenant has no such model.
  virtual absl::StatusOr<int64_t> DeleteModelUnlessUsed(const std::string& tenant, const std::string& id) = 0;
  // Whether some tenant still has the model (so that its bytes must stay).
  virtual absl::StatusOr<bool> ModelStoredByAnyTenant(const std::string& id) = 0;
  // The tenant's jobs in `states` that use the model.
  virtual absl::StatusOr<int64_t> CountJobsUsingModel(const std::string& tenant, const std::string& model_id,
                                              const std::vector<v1::JobState>& states) = 0;
  virtual absl::StatusOr<TenantUsage> Usage(const std::string& tenant) = 0;

  // Reservations (struct Reservation). Reserve sets the key's reservation to `r.bytes` if the
  // tenant's models, results and other reservations plus `r.bytes` stay within `limit` (0: no
  // limit), counted in the transaction that writes it (PostgreSQL: under the tenant's advisory
  // lock), so that of two writers racing for the last bytes exactly one gets them. Refused,
  // nothing changes (a reservation the key held stays as it was). `now_ms` is its touch time.
  virtual absl::StatusOr<ReserveOutcome> Reserve(const Reservation& r, int64_t limit, int64_t now_ms) = 0;
  // Marks the key's reservation as in use at `now_ms` (written only when its touch time is
  // older than kReservationTouchEvery). false when the tenant holds none under the key (it
  // was released, or expired).
  virtual absl::StatusOr<bool> TouchReservation(const std::string& tenant, const std::string& key,
                                                int64_t now_ms) = 0;
  virtual absl::Status ReleaseReservation(const std::string& tenant, const std::string& key) = 0;  // OK if none
  // Removes every reservation not touched since `touched_before_ms` (the retention sweeper's
  // idle uploads, and what a process that died while holding one left); how many.
  virtual absl::StatusOr<int64_t> ExpireReservations(int64_t touched_before_ms) = 0;

  // Jobs. CreateJob assigns nothing: job.id, tenant and request_id are the caller's. If a
  // job of the same tenant with the same non-empty request_id exists, returns it and
  // `*created` = false.
  // `events` are stored with a new job, in the same transaction (a claimer in another
  // thread or process never sees the job without them), and so are `children` (the shards
  // of a sharded job: parent_id = job.id, no request_id) with their events.
  // A job with a parent_id is a shard: ListJobs, Usage, CountJobsUsingModel, CountJobsInStates
  // and `quota` count top-level jobs only.
  // Over a limit of `quota` (the tenant's jobs counted in the same transaction as the insert,
  // so two processes creating at once cannot both pass): RESOURCE_EXHAUSTED naming it, and
  // nothing stored. An existing request_id is looked up first: a retried submission is
  // answered with its job, over quota or not.
  // `plan` is the job's plan (server/jobs makes it at admission; opaque bytes here), stored
  // in the job's row in the same transaction; a retried submission leaves the stored plan
  // as it is.
  virtual absl::StatusOr<v1::Job> CreateJob(const v1::Job& job, bool* created,
                                            std::vector<v1::JobEvent> events = {},
                                            std::vector<NewJob> children = {},
                                            const JobQuota& quota = {}, const std::string& plan = "") = 0;
  // The plan bytes stored with job `id` (a top-level job or a shard), byte for byte; empty
  // for a job stored without one (or before plans were, schema version 8). NOT_FOUND when
  // there is no such job.
  virtual absl::StatusOr<std::string> JobPlan(const std::string& id) = 0;
  // The shards of a sharded job, by shard index.
  virtual absl::StatusOr<std::vector<v1::Job>> ChildJobs(const std::string& parent_id) = 0;
  virtual absl::StatusOr<v1::Job> GetJob(const std::string& id) = 0;  // NOT_FOUND
  virtual absl::StatusOr<v1::Job> FindJobByRequestId(const std::string& tenant, const std::string& request_id) = 0;  // NOT_FOUND
  // Newest first. Page tokens are opaque strings. `tenant` empty: every tenant's.
  virtual absl::StatusOr<JobPage> ListJobs(const std::string& tenant, const std::vector<v1::JobState>& states,
                                   int page_size, const std::string& page_token) = 0;
  // Oldest first; for recovery at start-up and for filling the queue.
  virtual absl::StatusOr<std::vector<v1::Job>> JobsInStates(const std::vector<v1::JobState>& states) = 0;

  // Replaces the stored job and appends `event` (its seq and time are assigned here:
  // seq = last seq of the job + 1) in one transaction. Returns the event as stored.
  virtual absl::StatusOr<v1::JobEvent> UpdateJob(const v1::Job& job, v1::JobEvent event) = 0;
  // Replaces the stored job, stores `results` and appends `events` (seq and time assigned
  // here), all in one transaction: a job never ends without its results. With
  // `expected_version` >= 0, only if the stored version is still that one (ABORTED
  // otherwise: another process changed the job; read it again). Every write bumps the
  // version; a state other than RUNNING / CANCELLING drops the lease and the job's results
  // reservation (ResultsReservationKey; UpdateJob too): its results, if any, are rows now.
  virtual absl::Status CommitJob(const v1::Job& job, std::vector<v1::JobEvent> events,
                                 const std::map<v1::Artifact, ResultRef>& results = {},
                                 int64_t expected_version = -1) = 0;
  virtual absl::StatusOr<StoredJob> ReadJob(const std::string& id) = 0;  // NOT_FOUND
  // Deletes a top-level job that has ended (SUCCEEDED, FAILED or CANCELLED, and so have its
  // shards) with its shards, events and results, in one transaction. Returns the results it
  // held: their blobs go once nothing references them (BlobReferenced). FAILED_PRECONDITION
  // for a job not ended or a shard (it goes with its parent); NOT_FOUND.
  virtual absl::StatusOr<std::vector<ResultRef>> DeleteJob(const std::string& id) = 0;

  // Workers. ClaimJob takes the next QUEUED job — highest priority; within it, the tenant
  // whose last job started longest ago (fair between tenants); then the oldest — applies
  // `change` to it and stores it with a lease held by `owner` until `lease_until_ms`, all in
  // one transaction; two claimers never get the same job. nullopt: nothing waits.
  // Only jobs of `kind` (IsCoordinated: kCoordinate). A kRun claim passes over the jobs of a
  // tenant that holds `max_running` of its workers already (whatever their priority),
  // counted in the claim's transaction, so that the bound holds across processes too.
  virtual absl::StatusOr<std::optional<v1::Job>> ClaimJob(const std::string& owner, int64_t lease_until_ms,
                                                          const ClaimChange& change,
                                                          ClaimKind kind = ClaimKind::kRun,
                                                          const MaxRunningJobs& max_running = nullptr) = 0;
  // What the job `id` waits behind, were it QUEUED, all from one statement (QueueCounts);
  // NOT_FOUND when there is no such job.
  virtual absl::StatusOr<QueueCounts> CountQueue(const std::string& id, int64_t heard_since_ms, int64_t now_ms) = 0;
  // Extends `owner`'s lease on a running job and returns the job's state (CANCELLING tells
  // the worker to stop). FAILED_PRECONDITION once the lease is not `owner`'s any more.
  virtual absl::StatusOr<v1::JobState> RenewLease(const std::string& job_id, const std::string& owner,
                                                  int64_t lease_until_ms) = 0;
  // RUNNING / CANCELLING jobs whose lease ended before `now_ms` (their worker is gone).
  virtual absl::StatusOr<std::vector<StoredJob>> JobsWithExpiredLeases(int64_t now_ms) = 0;
  virtual absl::StatusOr<int64_t> CountJobsInStates(const std::vector<v1::JobState>& states) = 0;
  // Appends an event without changing the job (progress).
  virtual absl::StatusOr<v1::JobEvent> AppendEvent(const std::string& job_id, v1::JobEvent event) = 0;
  // Events with seq > after_seq, in order, at most `limit`.
  virtual absl::StatusOr<std::vector<v1::JobEvent>> EventsAfter(const std::string& job_id, int64_t after_seq,
                                                        int limit) = 0;

  // Results of a job, by artifact.
  virtual absl::Status PutResult(const std::string& job_id, v1::Artifact artifact, const ResultRef& ref) = 0;
  virtual absl::StatusOr<ResultRef> GetResult(const std::string& job_id, v1::Artifact artifact) = 0;  // NOT_FOUND
  // Whether any job's results reference the blob (so it must not be removed).
  virtual absl::StatusOr<bool> BlobReferenced(const std::string& sha256) = 0;

  // Worker processes' internal endpoints (cluster mode: where an api replica relays a
  // client's pushed batches), keyed by the owner name the process's leases carry. Written
  // by the worker process itself (its --advertise_address), never from a client's request:
  // an api replica connects only where a worker said it listens. Putting also forgets
  // endpoints not refreshed for a week whose owner holds no lease (processes long gone).
  virtual absl::Status PutWorkerEndpoint(const std::string& owner, const std::string& address, int64_t now_ms) = 0;
  virtual absl::StatusOr<std::string> WorkerEndpoint(const std::string& owner) = 0;  // NOT_FOUND
  // The addresses of the endpoints put at or after `heard_since_ms` (each once; most recently
  // heard from first): the worker processes that an api replica may ask to inspect an upload.
  virtual absl::StatusOr<std::vector<std::string>> LiveWorkerEndpoints(int64_t heard_since_ms) = 0;

};

// The connections a PostgreSQL store opens at most (--store_connections).
inline constexpr int kDefaultStoreConnections = 4;

// "sqlite:PATH" (or a bare PATH) or "postgresql://USER@HOST:PORT/DB" (any libpq URI), with a
// pool of up to `postgres_connections` (PostgreSQL only). Creates the schema, or migrates an
// older one, before it returns.
absl::StatusOr<std::unique_ptr<MetadataStore>> OpenMetadataStore(const std::string& spec,
                                                                 int postgres_connections = kDefaultStoreConnections);

}  // namespace recal::store
