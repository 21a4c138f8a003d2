// Models: content-addressed uploads (resumable, digest verified, inspected before they are
// accepted), lookup, listing and deletion.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/job_runner.h"
#include "server/store/blob_store.h"
#include "server/store/metadata_store.h"

namespace recal::jobs {

class ModelRegistry {
 public:
  // `runner` validates and inspects every upload (the server never loads a model itself).
  ModelRegistry(store::MetadataStore* metadata, store::BlobStore* blobs, int64_t max_model_bytes,
                JobRunner* runner)
      : metadata_(metadata), blobs_(blobs), max_model_bytes_(max_model_bytes), runner_(runner) {}

  // Checks the header. Returns the model if these bytes are stored already (nothing to
  // upload), std::nullopt if the upload should proceed.
  absl::StatusOr<std::optional<v1::Model>> StartUpload(const v1::UploadHeader& header);
  absl::Status AppendChunk(const v1::UploadHeader& header, const v1::UploadChunk& chunk);
  // Once every byte is committed: verifies the digest, loads the archive, validates its
  // graphs, inspects it, and stores the model.
  absl::StatusOr<v1::Model> FinishUpload(const v1::UploadHeader& header);
  absl::StatusOr<v1::UploadStatus> UploadStatus(const std::string& sha256);

  absl::StatusOr<v1::Model> Get(const std::string& id);
  absl::StatusOr<store::ModelPage> List(int page_size, const std::string& page_token);
  // FAILED_PRECONDITION while a queued or running job uses it.
  absl::Status Delete(const std::string& id);

  // The archive of a stored model.
  absl::StatusOr<std::string> PathOf(const std::string& id);

 private:
  store::MetadataStore* metadata_;
  store::BlobStore* blobs_;
  const int64_t max_model_bytes_;
  JobRunner* runner_;
};

// "sha256:<hex>" <-> "<hex>"; INVALID_ARGUMENT for anything else.
absl::StatusOr<std::string> DigestOfModelId(const std::string& id);
std::string ModelIdOf(const std::string& sha256_hex);

}  // namespace recal::jobs
