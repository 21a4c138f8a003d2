// CreateJob's rules, once for every metadata backend: what a new job (and the shards stored
// with it) must be, when a submission is a retry of a stored one, the tenant's quotas, the
// model it must find, and what a taken id means. A backend opens its transaction, answers the
// few queries of JobCreationQueries inside it, and commits when told; the order of the checks
// is decided here. Internal to server/store.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "server/store/metadata_store.h"

namespace recal::store::internal {

// A tenant's top-level jobs, as JobQuota counts them.
struct TopLevelJobCounts {
  int64_t active = 0;         // QUEUED, RUNNING or CANCELLING
  int64_t created_after = 0;  // created after the time asked about
};

// The queries CreateJob's rules ask of a backend, all answered inside the one transaction
// the backend holds while they run. Once LockTenant has returned (or, without it, once a row
// the backend waits on is free), each read must see what was committed before it.
class JobCreationQueries {
 public:
  virtual ~JobCreationQueries() = default;

  // Makes the tenant's job creations take turns until the transaction ends, so that what
  // CountTopLevelJobs says stays true until the job is stored. Called before any other query,
  // and only when a quota is to be counted.
  virtual absl::Status LockTenant(const std::string& tenant) = 0;
  // The tenant's job with `request_id`, if any.
  virtual absl::StatusOr<std::optional<v1::Job>> JobWithRequestId(const std::string& tenant,
                                                                  const std::string& request_id) = 0;
  virtual absl::StatusOr<TopLevelJobCounts> CountTopLevelJobs(const std::string& tenant, int64_t created_after_ms) = 0;
  // Whether the tenant has the model; one it has stays (no deletion passes) until the
  // transaction ends.
  virtual absl::StatusOr<bool> HoldModel(const std::string& tenant, const std::string& model_id) = 0;
  // Stores `job`, created at `created_ms`, with its `events` (seq and time assigned) and its
  // `plan` (the bytes as given, in its row), unless a key of its row is taken (its id, its
  // tenant and request_id, or the backend's own): whether it did.
  virtual absl::StatusOr<bool> InsertNewJob(const v1::Job& job, const std::vector<v1::JobEvent>& events,
                                            const std::string& plan, int64_t created_ms) = 0;
  virtual absl::StatusOr<bool> JobExists(const std::string& id) = 0;
};

// Whether `quota` limits anything, i.e. whether CreateJob must lock and count the tenant's
// jobs.
inline bool Limits(const JobQuota& quota) {
  return quota.max_active_jobs > 0 || quota.max_submissions_per_minute > 0;
}

// One CreateJob call (MetadataStore::CreateJob says what it promises): checked and given its
// creation time once, before the backend opens its transaction, then stored by StoreIn inside
// it, which a backend may run again on a fresh transaction (a reconnect).
class JobCreation {
 public:
  // INVALID_ARGUMENT naming the first of `job` and `children` that is not storable: an id and
  // a tenant, and children that are the job's shards (parent_id = its id, same tenant, no
  // request_id). The creation time is quota.now_ms, or the clock's now. `plan` is stored
  // with the job, each child's NewJob::plan with it. The arguments must outlive the
  // JobCreation.
  static absl::StatusOr<JobCreation> Check(const v1::Job& job, const std::vector<v1::JobEvent>& events,
                                           const std::vector<NewJob>& children, const JobQuota& quota,
                                           const std::string& plan);

  // The answer to CreateJob: the job, and whether this call stored it (the caller then commits
  // its transaction; otherwise it rolls it back: the job is the one stored before).
  struct Outcome {
    v1::Job job;
    bool created = false;
  };
  // The rules, in this order: the tenant's lock when a quota is counted; a stored job with the
  // same request_id is the answer (a retry is answered over quota or not, and whether or not
  // its model is still there); the quotas (RESOURCE_EXHAUSTED naming the first reached:
  // active jobs, then submissions in the minute before); the model when it must exist
  // (NOT_FOUND); then the job and its shards with their plans, all or none (a taken id:
  // ALREADY_EXISTS). On an error the caller's transaction is to roll back.
  absl::StatusOr<Outcome> StoreIn(JobCreationQueries& queries) const;

 private:
  JobCreation(const v1::Job& job, const std::vector<v1::JobEvent>& events, const std::vector<NewJob>& children,
              const JobQuota& quota, const std::string& plan, int64_t created_ms)
      : job_(&job), events_(&events), children_(&children), quota_(&quota), plan_(&plan), created_ms_(created_ms) {}

  // The answer when the job's own row could not be inserted: the job a concurrent creator
  // stored under the same request_id, or why the id is taken.
  absl::StatusOr<Outcome> NotInserted(JobCreationQueries& queries) const;

  const v1::Job* job_;
  const std::vector<v1::JobEvent>* events_;
  const std::vector<NewJob>* children_;
  const JobQuota* quota_;
  const std::string* plan_;
  int64_t created_ms_;
};

}  // namespace recal::store::internal
