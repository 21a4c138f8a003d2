// The cluster-mode metadata store: one PostgreSQL database shared by several recal-server
// processes. Behaves as SqliteMetadataStore through the interface (same semantics, same
// messages); what differs underneath:
//  - Each store object keeps a pool of up to max_connections connections, opened as calls
//    need them: a call holds one for its whole transaction, so a call waiting on a row or
//    advisory lock (another process's claim, a tenant's quota) holds up only the calls that
//    find every connection taken. Transactions of one process are as apart as those of two.
//  - A connection found broken is reopened once and the work redone, unless COMMIT had
//    already gone out (then the outcome is unknown and the call fails with UNAVAILABLE).
//  - Event seq stays dense and unique across processes: the job row is locked (UPDATE or
//    SELECT ... FOR UPDATE) in the transaction that reads the last seq and inserts.
//  - create_seq comes from identity columns: ordered, with gaps, and in the order rows were
//    inserted rather than committed.
//  - Text the database cannot hold (NUL bytes, invalid UTF-8) is INVALID_ARGUMENT.
#pragma once

#include <memory>
#include <string>

#include "server/store/metadata_store.h"

namespace recal::store {

class PostgresMetadataStore final : public MetadataStore {
 public:
  // Connects to a libpq URI ("postgresql://USER:PASSWORD@HOST:PORT/DB?sslmode=...") and
  // creates the schema if the database has none. Several processes may open a fresh
  // database at once. UNAVAILABLE when the server cannot be reached.
  static absl::StatusOr<std::unique_ptr<PostgresMetadataStore>> Open(const std::string& uri,
                                                                     int max_connections = kDefaultStoreConnections);
  ~PostgresMetadataStore() override;

  absl::StatusOr<v1::Model> PutModel(const v1::Model& model) override;
  absl::StatusOr<v1::Model> GetModel(const std::string& tenant, const std::string& id) override;
  absl::StatusOr<v1::Model> GetModelVersion(const std::string& tenant, const std::string& name,
                                            int64_t version) override;
  absl::StatusOr<std::vector<v1::Model>> FindModelsByDigestPrefix(const std::string& tenant,
                                                                  const std::string& hex_prefix, int limit) override;
  absl::StatusOr<ModelPage> ListModels(const std::string& tenant, int page_size, const std::string& page_token,
                                       const std::string& name) override;
  absl::Status DeleteModel(const std::string& tenant, const std::string& id) override;
  absl::StatusOr<int64_t> DeleteModelUnlessUsed(const std::string& tenant, const std::string& id) override;
  absl::StatusOr<bool> ModelStoredByAnyTenant(const std::string& id) override;
  absl::StatusOr<int64_t> CountJobsUsingModel(const std::string& tenant, const std::string& model_id,
                                              const std::vector<v1::JobState>& states) override;
  absl::StatusOr<TenantUsage> Usage(const std::string& tenant) override;
  absl::StatusOr<ReserveOutcome> Reserve(const Reservation& r, int64_t limit, int64_t now_ms) override;
  absl::StatusOr<bool> TouchReservation(const std::string& tenant, const std::string& key, int64_t now_ms) override;
  absl::Status ReleaseReservation(const std::string& tenant, const std::string& key) override;
  absl::StatusOr<int64_t> ExpireReservations(int64_t touched_before_ms) override;
  absl::StatusOr<v1::Job> CreateJob(const v1::Job& job, bool* created, std::vector<v1::JobEvent> events,
                                    std::vector<NewJob> children, const JobQuota& quota,
                                    const std::string& plan) override;
  absl::StatusOr<std::string> JobPlan(const std::string& id) override;
  absl::StatusOr<std::vector<v1::Job>> ChildJobs(const std::string& parent_id) override;
  absl::StatusOr<v1::Job> GetJob(const std::string& id) override;
  absl::StatusOr<v1::Job> FindJobByRequestId(const std::string& tenant, const std::string& request_id) override;
  absl::StatusOr<JobPage> ListJobs(const std::string& tenant, const std::vector<v1::JobState>& states,
                                   int page_size, const std::string& page_token) override;
  absl::StatusOr<std::vector<v1::Job>> JobsInStates(const std::vector<v1::JobState>& states) override;
  absl::StatusOr<v1::JobEvent> UpdateJob(const v1::Job& job, v1::JobEvent event) override;
  absl::Status CommitJob(const v1::Job& job, std::vector<v1::JobEvent> events,
                         const std::map<v1::Artifact, ResultRef>& results, int64_t expected_version) override;
  absl::StatusOr<StoredJob> ReadJob(const std::string& id) override;
  absl::StatusOr<std::vector<ResultRef>> DeleteJob(const std::string& id) override;
  absl::StatusOr<std::optional<v1::Job>> ClaimJob(const std::string& owner, int64_t lease_until_ms,
                                                  const ClaimChange& change, ClaimKind kind,
                                                  const MaxRunningJobs& max_running) override;
  absl::StatusOr<QueueCounts> CountQueue(const std::string& id, int64_t heard_since_ms, int64_t now_ms) override;
  absl::StatusOr<v1::JobState> RenewLease(const std::string& job_id, const std::string& owner,
                                          int64_t lease_until_ms) override;
  absl::StatusOr<std::vector<StoredJob>> JobsWithExpiredLeases(int64_t now_ms) override;
  absl::StatusOr<int64_t> CountJobsInStates(const std::vector<v1::JobState>& states) override;
  // LISTEN on a connection of its own; every job write NOTIFYs in its transaction.
  std::unique_ptr<ChangeWatch> WatchChanges(std::function<void()> on_change) override;
  absl::StatusOr<v1::JobEvent> AppendEvent(const std::string& job_id, v1::JobEvent event) override;
  absl::StatusOr<std::vector<v1::JobEvent>> EventsAfter(const std::string& job_id, int64_t after_seq,
                                                        int limit) override;
  absl::Status PutResult(const std::string& job_id, v1::Artifact artifact, const ResultRef& ref) override;
  absl::StatusOr<ResultRef> GetResult(const std::string& job_id, v1::Artifact artifact) override;
  absl::StatusOr<bool> BlobReferenced(const std::string& sha256) override;
  absl::Status PutWorkerEndpoint(const std::string& owner, const std::string& address, int64_t now_ms) override;
  absl::StatusOr<std::string> WorkerEndpoint(const std::string& owner) override;
  absl::StatusOr<std::vector<std::string>> LiveWorkerEndpoints(int64_t heard_since_ms) override;

 private:
  struct Impl;
  explicit PostgresMetadataStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace recal::store
