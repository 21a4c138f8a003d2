#include "server/jobs/storage.h"

#include "common/status_macros.h"
#include "server/jobs/model_registry.h"

namespace recal::jobs {

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
  usage.set_active_jobs(stored.active_jobs);
  usage.set_stored_bytes(stored.stored_bytes + uploads.bytes);
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

}  // namespace recal::jobs
