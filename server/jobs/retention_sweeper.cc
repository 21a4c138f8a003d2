#include "server/jobs/retention_sweeper.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/util/time_util.h"
#include "server/jobs/model_registry.h"
#include "server/jobs/storage.h"
#include "server/log/log.h"

namespace recal::jobs {
namespace {

// Rows read per page while sweeping: bounded memory per statement, few round trips.
constexpr int kPageSize = 500;

const std::vector<v1::JobState> kEndedStates = {v1::SUCCEEDED, v1::FAILED, v1::CANCELLED};

absl::Time EndOf(const v1::Job& job) {
  return absl::FromUnixMillis(google::protobuf::util::TimeUtil::TimestampToMilliseconds(job.end_time()));
}

}  // namespace

RetentionSweeper::RetentionSweeper(store::MetadataStore* metadata, store::BlobStore* blobs, SweeperOptions options)
    : metadata_(metadata), blobs_(blobs), options_(std::move(options)) {}

RetentionSweeper::~RetentionSweeper() { Stop(); }

RetentionPolicy RetentionSweeper::PolicyOf(const std::string& tenant) const {
  return options_.retention ? options_.retention(tenant) : RetentionPolicy();
}

absl::StatusOr<SweepCounts> RetentionSweeper::SweepOnce() {
  SweepCounts counts;
  if (options_.upload_idle > absl::ZeroDuration()) {
    const absl::Time idle_before = options_.now() - options_.upload_idle;
    RECAL_ASSIGN_OR_RETURN(counts.uploads_expired, blobs_->ExpireUploads(idle_before));
    // An upload's reservation is touched at most every kReservationTouchEvery, so it goes that
    // much after its staged bytes, never before them. So do those whose holder died (a replica
    // with its staged uploads, a worker between its results' reservation and their rows).
    RECAL_ASSIGN_OR_RETURN(counts.reservations_expired,
                           metadata_->ExpireReservations(
                               absl::ToUnixMillis(idle_before - store::kReservationTouchEvery)));
  }
  RECAL_RETURN_IF_ERROR(SweepModels(counts));
  RECAL_RETURN_IF_ERROR(SweepJobs(counts));
  return counts;
}

absl::Status RetentionSweeper::SweepModels(SweepCounts& counts) {
  // Every tenant's models, grouped by tenant and name.
  std::map<std::pair<std::string, std::string>, std::vector<v1::Model>> versions;
  std::string token;
  do {
    RECAL_ASSIGN_OR_RETURN(store::ModelPage page, metadata_->ListModels("", kPageSize, token, ""));
    for (v1::Model& model : page.models) {
      versions[{model.tenant(), model.name()}].push_back(std::move(model));
    }
    token = std::move(page.next_page_token);
  } while (!token.empty());
  for (auto& [key, models] : versions) {
    const int64_t keep = PolicyOf(key.first).keep_versions;
    if (keep <= 0 || static_cast<int64_t>(models.size()) <= keep) continue;
    std::sort(models.begin(), models.end(),
              [](const v1::Model& a, const v1::Model& b) { return a.version() > b.version(); });
    for (size_t i = static_cast<size_t>(keep); i < models.size(); ++i) {
      RECAL_RETURN_IF_ERROR(DeleteOldVersion(models[i], counts));
    }
  }
  return absl::OkStatus();
}

absl::Status RetentionSweeper::DeleteOldVersion(const v1::Model& model, SweepCounts& counts) {
  absl::StatusOr<int64_t> users = metadata_->DeleteModelUnlessUsed(model.tenant(), model.id());
  if (absl::IsNotFound(users.status())) return absl::OkStatus();  // deleted meanwhile (by hand, another replica)
  if (!users.ok()) return users.status();
  if (*users > 0) {
    ++counts.models_kept_for_jobs;
    return absl::OkStatus();
  }
  ++counts.models_deleted;
  log::Info("retention: model version deleted", {{"tenant", model.tenant()},
                                                  {"model_id", model.id()},
                                                  {"name", model.name()},
                                                  {"version", model.version()}});
  RECAL_ASSIGN_OR_RETURN(const std::string digest, DigestOfModelId(model.id()));
  return RemoveBlobIfUnreferenced(*metadata_, *blobs_, digest);
}

absl::Status RetentionSweeper::SweepJobs(SweepCounts& counts) {
  const absl::Time now = options_.now();
  std::string token;
  do {
    // Page tokens continue below the last row returned: deleting rows behind does not move them.
    RECAL_ASSIGN_OR_RETURN(store::JobPage page, metadata_->ListJobs("", kEndedStates, kPageSize, token));
    for (const v1::Job& job : page.jobs) {
      const int64_t days = PolicyOf(job.tenant()).keep_results_days;
      if (days <= 0 || !job.has_end_time() || EndOf(job) + absl::Hours(24 * days) > now) continue;
      absl::StatusOr<std::vector<store::ResultRef>> results = metadata_->DeleteJob(job.id());
      if (absl::IsNotFound(results.status())) continue;
      if (!results.ok()) return results.status();
      ++counts.jobs_deleted;
      for (const store::ResultRef& result : *results) {
        RECAL_RETURN_IF_ERROR(RemoveBlobIfUnreferenced(*metadata_, *blobs_, result.sha256));
      }
    }
    token = std::move(page.next_page_token);
  } while (!token.empty());
  return absl::OkStatus();
}

void RetentionSweeper::Start() {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    do {
      lock.unlock();
      absl::StatusOr<SweepCounts> swept = SweepOnce();
      if (!swept.ok()) {
        log::Warning("retention: sweep failed, retried at the next", {{"error", std::string(swept.status().message())}});
      } else if (swept->models_deleted + swept->jobs_deleted + swept->uploads_expired + swept->models_kept_for_jobs +
                     swept->reservations_expired > 0) {
        log::Info("retention: swept", {{"models_deleted", swept->models_deleted},
                                       {"models_kept_for_jobs", swept->models_kept_for_jobs},
                                       {"jobs_deleted", swept->jobs_deleted},
                                       {"uploads_expired", swept->uploads_expired},
                                       {"reservations_expired", swept->reservations_expired}});
      }
      lock.lock();
    } while (!wake_.wait_for(lock, absl::ToChronoMilliseconds(options_.interval), [this] { return stopping_; }));
  });
}

void RetentionSweeper::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace recal::jobs
