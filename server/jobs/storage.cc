#include "server/jobs/storage.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "server/jobs/model_registry.h"
#include "server/jobs/store_retry.h"
#include "server/log/log.h"

namespace recal::jobs {
namespace {

constexpr absl::string_view kUploadFix =
    "delete models or jobs, finish or wait out unfinished uploads (recalctl usage), or ask an admin";
constexpr absl::string_view kResultsFix =
    "delete models or jobs (recalctl usage) and submit the job again, or ask an admin";

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace

absl::StatusOr<v1::Usage> UsageOf(store::MetadataStore& metadata, const store::BlobStore& blobs,
                                  const std::string& tenant) {
  RECAL_ASSIGN_OR_RETURN(const store::TenantUsage stored, metadata.Usage(tenant));
  RECAL_ASSIGN_OR_RETURN(const store::UploadUsage uploads, blobs.UploadUsageOf(tenant));
  v1::Usage usage;
  usage.set_tenant(tenant);
  usage.set_models(stored.models);
  usage.set_model_bytes(stored.model_bytes);
  usage.set_results(stored.results);
  usage.set_result_bytes(stored.result_bytes);
  usage.set_uploads(uploads.uploads);
  usage.set_upload_bytes(uploads.bytes);
  usage.set_reserved_bytes(stored.reserved_bytes);
  usage.set_active_jobs(stored.active_jobs);
  usage.set_stored_bytes(stored.stored_bytes);
  return usage;
}

absl::Status RemoveBlobIfUnreferenced(store::MetadataStore& metadata, store::BlobStore& blobs,
                                      const std::string& sha256_hex) {
  RECAL_ASSIGN_OR_RETURN(const bool model, metadata.ModelStoredByAnyTenant(ModelIdOf(sha256_hex)));
  if (model) return absl::OkStatus();
  RECAL_ASSIGN_OR_RETURN(const bool result, metadata.BlobReferenced(sha256_hex));
  if (result) return absl::OkStatus();
  return blobs.Remove(sha256_hex);
}

absl::Status StoredBytesQuota::Reserve(const store::Reservation& reservation, absl::string_view what,
                                       absl::string_view fix) {
  const int64_t limit = limit_ ? limit_(reservation.tenant) : 0;
  RECAL_ASSIGN_OR_RETURN(const store::ReserveOutcome outcome, metadata_->Reserve(reservation, limit, NowMs()));
  if (outcome.granted) return absl::OkStatus();
  const store::TenantUsage& usage = outcome.usage_before;
  return absl::ResourceExhaustedError(absl::StrCat(
      "tenant ", reservation.tenant, " would store ", usage.stored_bytes + reservation.bytes, " bytes (models ",
      usage.model_bytes, ", results ", usage.result_bytes, ", unfinished uploads and results being stored ",
      usage.reserved_bytes, ", ", what, " ", reservation.bytes, "), over its quota max_stored_bytes=", limit, "; ",
      fix));
}

absl::Status StoredBytesQuota::ReserveUpload(const std::string& tenant, const v1::UploadHeader& header) {
  return Reserve({tenant, store::UploadReservationKey(header.sha256()), header.size()}, "this upload", kUploadFix);
}

absl::StatusOr<bool> StoredBytesQuota::TouchUpload(const std::string& tenant, const v1::UploadHeader& header) {
  return metadata_->TouchReservation(tenant, store::UploadReservationKey(header.sha256()), NowMs());
}

absl::Status StoredBytesQuota::ReleaseUpload(const std::string& tenant, const std::string& sha256_hex) {
  return metadata_->ReleaseReservation(tenant, store::UploadReservationKey(sha256_hex));
}

absl::Status StoredBytesQuota::ReserveResults(const v1::Job& job, const std::filesystem::path& scratch,
                                              const ScratchFiles& files) {
  int64_t bytes = 0;
  for (const auto& [artifact, name] : files) {
    std::error_code error;
    const std::uintmax_t size = std::filesystem::file_size(scratch / name, error);
    // A file the run did not leave fails its adoption, which says so; it adds nothing here.
    if (!error) bytes += static_cast<int64_t>(size);
  }
  return Reserve({job.tenant(), store::ResultsReservationKey(job.id()), bytes}, "this job's results", kResultsFix);
}

absl::Status StoredBytesQuota::ReserveResultsWhileHeld(const v1::Job& job, const std::filesystem::path& scratch,
                                                       const ScratchFiles& files, const RunFlags& flags) {
  bool warned = false;
  return RetryWhileUnavailable([&] { return ReserveResults(job, scratch, files); },
                               [&](const absl::Status& unavailable) {
                                 const bool held = !flags.lease_lost && !flags.cancel;
                                 if (held && !warned) {
                                   log::Warning("job results not reserved yet: trying again while the lease holds",
                                                {{"job_id", job.id()}, {"error", std::string(unavailable.message())}});
                                   warned = true;
                                 }
                                 return held;
                               });
}

}  // namespace recal::jobs
