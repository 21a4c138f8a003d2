// The durable metadata: models, jobs, job events and result references. Two backends behind
// one interface and one conformance suite (tests/store/metadata_store_test.cc): SQLite (the
// embedded default, one process) and PostgreSQL (the cluster mode). Messages are stored as
// serialized protobufs next to the columns that are queried. Implementations are thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// What a tenant holds, for its quotas.
struct TenantUsage {
  int64_t active_jobs = 0;   // QUEUED, RUNNING or CANCELLING
  int64_t stored_bytes = 0;  // its models and its jobs' results
};

// The tenant of everything made while authentication is off, and of all rows a database
// from before tenants had.
inline constexpr char kDefaultTenant[] = "default";

struct ModelPage {
  std::vector<v1::Model> models;
  std::string next_page_token;
};

class MetadataStore {
 public:
  virtual ~MetadataStore() = default;
  // Models (keyed by tenant and id). PutModel inserts or keeps the existing one (same
  // tenant and bytes = one model).
  virtual absl::StatusOr<v1::Model> PutModel(const v1::Model& model) = 0;
  virtual absl::StatusOr<v1::Model> GetModel(const std::string& tenant, const std::string& id) = 0;  // NOT_FOUND
  // `tenant` empty: every tenant's.
  virtual absl::StatusOr<ModelPage> ListModels(const std::string& tenant, int page_size, const std::string& page_token) = 0;
  virtual absl::Status DeleteModel(const std::string& tenant, const std::string& id) = 0;  // NOT_FOUND
  // Whether some tenant still has the model (so that its bytes must stay).
  virtual absl::StatusOr<bool> ModelStoredByAnyTenant(const std::string& id) = 0;
  // The tenant's jobs in `states` that use the model.
  virtual absl::StatusOr<int64_t> CountJobsUsingModel(const std::string& tenant, const std::string& model_id,
                                              const std::vector<v1::JobState>& states) = 0;
  virtual absl::StatusOr<TenantUsage> Usage(const std::string& tenant) = 0;

  // Jobs. CreateJob assigns nothing: job.id, tenant and request_id are the caller's. If a
  // job of the same tenant with the same non-empty request_id exists, returns it and
  // `*created` = false.
  virtual absl::StatusOr<v1::Job> CreateJob(const v1::Job& job, bool* created) = 0;
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
  // here), all in one transaction: a job never ends without its results.
  virtual absl::Status CommitJob(const v1::Job& job, std::vector<v1::JobEvent> events,
                         const std::map<v1::Artifact, ResultRef>& results = {}) = 0;
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

};

// "sqlite:PATH" (or a bare PATH) or "postgresql://USER@HOST:PORT/DB" (any libpq URI).
// Creates the schema, or migrates an older one, before it returns.
absl::StatusOr<std::unique_ptr<MetadataStore>> OpenMetadataStore(const std::string& spec);

}  // namespace recal::store
