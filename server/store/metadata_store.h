// Models, jobs, job events and result references in SQLite (WAL, synchronous=FULL). Messages
// are stored as serialized protobufs next to the columns that are queried. Thread-safe: one
// connection behind a mutex.
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
  // Creates the file and schema if needed.
  static absl::StatusOr<std::unique_ptr<MetadataStore>> Open(const std::string& path);
  ~MetadataStore();

  // Models (keyed by tenant and id). PutModel inserts or keeps the existing one (same
  // tenant and bytes = one model).
  absl::StatusOr<v1::Model> PutModel(const v1::Model& model);
  absl::StatusOr<v1::Model> GetModel(const std::string& tenant, const std::string& id);  // NOT_FOUND
  // `tenant` empty: every tenant's.
  absl::StatusOr<ModelPage> ListModels(const std::string& tenant, int page_size, const std::string& page_token);
  absl::Status DeleteModel(const std::string& tenant, const std::string& id);  // NOT_FOUND
  // Whether some tenant still has the model (so that its bytes must stay).
  absl::StatusOr<bool> ModelStoredByAnyTenant(const std::string& id);
  // The tenant's jobs in `states` that use the model.
  absl::StatusOr<int64_t> CountJobsUsingModel(const std::string& tenant, const std::string& model_id,
                                              const std::vector<v1::JobState>& states);
  absl::StatusOr<TenantUsage> Usage(const std::string& tenant);

  // Jobs. CreateJob assigns nothing: job.id, tenant and request_id are the caller's. If a
  // job of the same tenant with the same non-empty request_id exists, returns it and
  // `*created` = false.
  absl::StatusOr<v1::Job> CreateJob(const v1::Job& job, bool* created);
  absl::StatusOr<v1::Job> GetJob(const std::string& id);  // NOT_FOUND
  absl::StatusOr<v1::Job> FindJobByRequestId(const std::string& tenant, const std::string& request_id);  // NOT_FOUND
  // Newest first. Page tokens are opaque strings. `tenant` empty: every tenant's.
  absl::StatusOr<JobPage> ListJobs(const std::string& tenant, const std::vector<v1::JobState>& states,
                                   int page_size, const std::string& page_token);
  // Oldest first; for recovery at start-up and for filling the queue.
  absl::StatusOr<std::vector<v1::Job>> JobsInStates(const std::vector<v1::JobState>& states);

  // Replaces the stored job and appends `event` (its seq and time are assigned here:
  // seq = last seq of the job + 1) in one transaction. Returns the event as stored.
  absl::StatusOr<v1::JobEvent> UpdateJob(const v1::Job& job, v1::JobEvent event);
  // Replaces the stored job, stores `results` and appends `events` (seq and time assigned
  // here), all in one transaction: a job never ends without its results.
  absl::Status CommitJob(const v1::Job& job, std::vector<v1::JobEvent> events,
                         const std::map<v1::Artifact, ResultRef>& results = {});
  // Appends an event without changing the job (progress).
  absl::StatusOr<v1::JobEvent> AppendEvent(const std::string& job_id, v1::JobEvent event);
  // Events with seq > after_seq, in order, at most `limit`.
  absl::StatusOr<std::vector<v1::JobEvent>> EventsAfter(const std::string& job_id, int64_t after_seq,
                                                        int limit);

  // Results of a job, by artifact.
  absl::Status PutResult(const std::string& job_id, v1::Artifact artifact, const ResultRef& ref);
  absl::StatusOr<ResultRef> GetResult(const std::string& job_id, v1::Artifact artifact);  // NOT_FOUND
  // Whether any job's results reference the blob (so it must not be removed).
  absl::StatusOr<bool> BlobReferenced(const std::string& sha256);

 private:
  struct Impl;
  explicit MetadataStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace recal::store
