// Models: content-addressed uploads (resumable, digest verified, inspected before they are
// accepted), lookup, listing and deletion.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/job_runner.h"
#include "server/store/blob_store.h"
#include "server/store/metadata_store.h"

namespace recal::jobs {

// What one tenant may hold and do; 0 = no limit. Read at each call, so that a reloaded
// auth file applies at once.
struct TenantLimits {
  int64_t max_active_jobs = 0;             // queued + running
  int64_t max_stored_bytes = 0;            // models + results
  int64_t max_submissions_per_minute = 0;
};
using TenantLimitsFn = std::function<TenantLimits(const std::string& tenant)>;

// Every call names the tenant it acts for: a tenant sees only its own models; another
// tenant's model answers exactly as a model that does not exist.
class ModelRegistry {
 public:
  // `runner` validates and inspects every upload (the server never loads a model itself).
  ModelRegistry(store::MetadataStore* metadata, store::BlobStore* blobs, int64_t max_model_bytes,
                JobRunner* runner, TenantLimitsFn limits = nullptr)
      : metadata_(metadata),
        blobs_(blobs),
        max_model_bytes_(max_model_bytes),
        runner_(runner),
        limits_(std::move(limits)) {}

  // Checks the header (and the tenant's stored-bytes quota). Returns the model if the
  // tenant has these bytes already (nothing to upload), std::nullopt if the upload should
  // proceed.
  absl::StatusOr<std::optional<v1::Model>> StartUpload(const std::string& tenant, const v1::UploadHeader& header);
  absl::Status AppendChunk(const std::string& tenant, const v1::UploadHeader& header, const v1::UploadChunk& chunk);
  // Once every byte is committed: verifies the digest, loads the archive, validates its
  // graphs, inspects it, and stores the model.
  absl::StatusOr<v1::Model> FinishUpload(const std::string& tenant, const v1::UploadHeader& header);
  absl::StatusOr<v1::UploadStatus> UploadStatus(const std::string& tenant, const std::string& sha256);

  absl::StatusOr<v1::Model> Get(const std::string& tenant, const std::string& id);
  // `tenant` empty: every tenant's (for admins).
  absl::StatusOr<store::ModelPage> List(const std::string& tenant, int page_size, const std::string& page_token);
  // FAILED_PRECONDITION while a queued or running job of the tenant uses it. The bytes go
  // once no tenant's model or result needs them.
  absl::Status Delete(const std::string& tenant, const std::string& id);

  // The digest of a stored model (NOT_FOUND as Get; UNAVAILABLE while the metadata store is
  // away). Its archive is BlobStore::LocalPath of it.
  absl::StatusOr<std::string> DigestOf(const std::string& tenant, const std::string& id);

 private:
  absl::Status CheckStorage(const std::string& tenant, int64_t more_bytes);

  store::MetadataStore* metadata_;
  store::BlobStore* blobs_;
  const int64_t max_model_bytes_;
  JobRunner* runner_;
  TenantLimitsFn limits_;
};

// "sha256:<hex>" <-> "<hex>"; INVALID_ARGUMENT for anything else.
absl::StatusOr<std::string> DigestOfModelId(const std::string& id);
std::string ModelIdOf(const std::string& sha256_hex);

}  // namespace recal::jobs
