#include "server/store/job_creation.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace recal::store::internal {
namespace {

absl::Status CheckNewJobs(const v1::Job& job, const std::vector<NewJob>& children) {
  if (job.id().empty()) return absl::InvalidArgumentError("cannot store a job without an id");
  if (job.tenant().empty()) return absl::InvalidArgumentError("cannot store a job without a tenant");
  for (const NewJob& child : children) {
    const v1::Job& c = child.job;
    if (c.id().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot store a shard of job '", job.id(), "' without an id"));
    }
    if (c.parent_id() != job.id()) {
      return absl::InvalidArgumentError(absl::StrCat("job '", c.id(), "' is stored as a shard of job '", job.id(),
                                                     "' but its parent_id is '", c.parent_id(), "'"));
    }
    if (c.tenant() != job.tenant()) {
      return absl::InvalidArgumentError(absl::StrCat("shard '", c.id(), "' of job '", job.id(), "' has tenant '",
                                                     c.tenant(), "', not its parent's '", job.tenant(), "'"));
    }
    if (!c.request_id().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard '", c.id(), "' of job '", job.id(), "' has a request_id; only its parent may"));
    }
  }
  return absl::OkStatus();
}

// The submissions quota counts top-level jobs created after this, for a job created at
// `now_ms`.
int64_t MinuteBefore(int64_t now_ms) { return now_ms - 60 * 1000; }

// RESOURCE_EXHAUSTED naming the first limit of `quota` that the tenant's jobs have reached;
// OK when there is room for one more.
absl::Status CheckQuota(const std::string& tenant, const JobQuota& quota, const TopLevelJobCounts& jobs) {
  if (quota.max_active_jobs > 0 && jobs.active >= quota.max_active_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant, " has ", jobs.active,
                                                     " jobs queued or running, its quota max_active_jobs=",
                                                     quota.max_active_jobs, "; retry when one has ended"));
  }
  if (quota.max_submissions_per_minute > 0 && jobs.created_after >= quota.max_submissions_per_minute) {
    return absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant, " submitted ", jobs.created_after,
                                                     " jobs in the last minute, its quota max_submissions_per_minute=",
                                                     quota.max_submissions_per_minute, "; retry later"));
  }
  return absl::OkStatus();
}

// The refusal when quota.model_must_exist and the model is not (any more) the tenant's.
absl::Status ModelGoneError(const std::string& model_id) {
  return absl::NotFoundError(absl::StrCat("model '", model_id,
                                          "' was deleted while the job was submitted; upload it again or name "
                                          "another model"));
}

// Why `id` could not be inserted: another job has it, or (only left to collide) the
// backend's own row number.
absl::Status IdTaken(JobCreationQueries& queries, const std::string& id) {
  RECAL_ASSIGN_OR_RETURN(const bool exists, queries.JobExists(id));
  if (exists) return absl::AlreadyExistsError(absl::StrCat("a job with id '", id, "' already exists"));
  return absl::InternalError(absl::StrCat("job '", id, "' was not stored: its create_seq is taken; the jobs "
                                          "table holds rows the store did not number"));
}

}  // namespace

absl::StatusOr<JobCreation> JobCreation::Check(const v1::Job& job, const std::vector<v1::JobEvent>& events,
                                               const std::vector<NewJob>& children, const JobQuota& quota,
                                               const std::string& plan) {
  RECAL_RETURN_IF_ERROR(CheckNewJobs(job, children));
  const int64_t created_ms = quota.now_ms != 0 ? quota.now_ms : absl::ToUnixMillis(absl::Now());
  return JobCreation(job, events, children, quota, plan, created_ms);
}

absl::StatusOr<JobCreation::Outcome> JobCreation::StoreIn(JobCreationQueries& queries) const {
  const v1::Job& job = *job_;
  const JobQuota& quota = *quota_;
  // The lock comes before the request_id look-up too: a concurrent creator of the same
  // request is then seen as a stored job, never counted against this one's quota.
  if (Limits(quota)) RECAL_RETURN_IF_ERROR(queries.LockTenant(job.tenant()));
  if (!job.request_id().empty()) {
    RECAL_ASSIGN_OR_RETURN(std::optional<v1::Job> existing, queries.JobWithRequestId(job.tenant(), job.request_id()));
    if (existing) return Outcome{*std::move(existing), false};
  }
  if (Limits(quota)) {
    RECAL_ASSIGN_OR_RETURN(const TopLevelJobCounts jobs,
                           queries.CountTopLevelJobs(job.tenant(), MinuteBefore(created_ms_)));
    RECAL_RETURN_IF_ERROR(CheckQuota(job.tenant(), quota, jobs));
  }
  if (quota.model_must_exist) {
    RECAL_ASSIGN_OR_RETURN(const bool model, queries.HoldModel(job.tenant(), job.spec().model_id()));
    if (!model) return ModelGoneError(job.spec().model_id());
  }
  RECAL_ASSIGN_OR_RETURN(const bool inserted, queries.InsertNewJob(job, *events_, *plan_, created_ms_));
  if (!inserted) return NotInserted(queries);
  // The children in order; any id taken fails the whole creation. They have no request_id:
  // only their id can collide.
  for (const NewJob& child : *children_) {
    RECAL_ASSIGN_OR_RETURN(const bool child_inserted,
                           queries.InsertNewJob(child.job, child.events, child.plan, created_ms_));
    if (!child_inserted) return IdTaken(queries, child.job.id());
  }
  return Outcome{job, true};
}

absl::StatusOr<JobCreation::Outcome> JobCreation::NotInserted(JobCreationQueries& queries) const {
  // A creator of the same request_id that committed after the look-up above (the insert
  // waited for it): its job is the answer, as it would have been a moment later. An existing
  // request_id wins over an existing id.
  if (!job_->request_id().empty()) {
    RECAL_ASSIGN_OR_RETURN(std::optional<v1::Job> existing,
                           queries.JobWithRequestId(job_->tenant(), job_->request_id()));
    if (existing) return Outcome{*std::move(existing), false};
  }
  return IdTaken(queries, job_->id());
}

}  // namespace recal::store::internal
