#include "server/jobs/model_registry.h"

#include <google/protobuf/util/time_util.h>

#include "absl/strings/match.h"
#include "common/now.h"
#include "absl/strings/str_cat.h"

namespace recal::jobs {
namespace {

constexpr absl::string_view kIdPrefix = "sha256:";

const std::vector<v1::JobState> kActiveStates = {v1::QUEUED, v1::RUNNING, v1::CANCELLING};

}  // namespace

absl::StatusOr<std::string> DigestOfModelId(const std::string& id) {
  if (!absl::StartsWith(id, kIdPrefix)) {
    return absl::InvalidArgumentError(absl::StrCat("model id '", id, "' is not sha256:<hex>"));
  }
  return id.substr(kIdPrefix.size());
}

std::string ModelIdOf(const std::string& sha256_hex) { return absl::StrCat(kIdPrefix, sha256_hex); }

absl::Status ModelRegistry::CheckStorage(const std::string& tenant, int64_t more_bytes) {
  const int64_t limit = limits_ ? limits_(tenant).max_stored_bytes : 0;
  if (limit <= 0) return absl::OkStatus();
  auto usage = metadata_->Usage(tenant);
  if (!usage.ok()) return usage.status();
  if (usage->stored_bytes + more_bytes > limit) {
    return absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant, " would store ", usage->stored_bytes + more_bytes,
                                                     " bytes, over its quota max_stored_bytes=", limit,
                                                     "; delete models or ask an admin"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<v1::Model>> ModelRegistry::StartUpload(const std::string& tenant,
                                                                    const v1::UploadHeader& header) {
  if (header.size() <= 0) return absl::InvalidArgumentError("upload header: size must be positive");
  if (header.size() > max_model_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("model of ", header.size(), " bytes exceeds the server's limit of ",
                                                     max_model_bytes_, " (--max_model_bytes)"));
  }
  auto existing = metadata_->GetModel(tenant, ModelIdOf(header.sha256()));
  if (existing.ok()) return std::optional<v1::Model>(*existing);
  if (existing.status().code() != absl::StatusCode::kNotFound) return existing.status();
  if (absl::Status room = CheckStorage(tenant, header.size()); !room.ok()) return room;
  // Validates the digest's form (it names a file).
  auto committed = blobs_->UploadedSize(tenant, header.sha256());
  if (!committed.ok()) return committed.status();
  return std::optional<v1::Model>();
}

absl::Status ModelRegistry::AppendChunk(const std::string& tenant, const v1::UploadHeader& header,
                                        const v1::UploadChunk& chunk) {
  return blobs_->AppendUpload(tenant, header.sha256(), chunk.offset(), chunk.data(), header.size());
}

absl::StatusOr<v1::Model> ModelRegistry::FinishUpload(const std::string& tenant, const v1::UploadHeader& header) {
  auto committed = blobs_->UploadedSize(tenant, header.sha256());
  if (!committed.ok()) return committed.status();
  if (*committed != header.size()) {
    return absl::FailedPreconditionError(absl::StrCat("upload incomplete: ", *committed, " of ", header.size(),
                                                      " bytes committed; resume from ", *committed));
  }
  auto path = blobs_->CommitUpload(tenant, header.sha256());
  if (!path.ok()) return path.status();
  auto layers = runner_->Inspect(*path);
  if (!layers.ok()) {
    // Not kept: nothing may refer to a model that was refused (unless the same bytes are
    // another tenant's already, and thus were accepted before).
    auto kept = metadata_->ModelStoredByAnyTenant(ModelIdOf(header.sha256()));
    if (kept.ok() && !*kept) blobs_->Remove(header.sha256()).IgnoreError();
    return absl::InvalidArgumentError(absl::StrCat("model refused: ", layers.status().message()));
  }
  v1::Model model;
  model.set_id(ModelIdOf(header.sha256()));
  model.set_tenant(tenant);
  model.set_name(header.name());
  model.set_size(header.size());
  model.mutable_labels()->insert(header.labels().begin(), header.labels().end());
  for (v1::BatchNormLayer& layer : *layers) *model.add_layers() = std::move(layer);
  *model.mutable_create_time() = NowTimestamp();
  return metadata_->PutModel(model);
}

absl::StatusOr<v1::UploadStatus> ModelRegistry::UploadStatus(const std::string& tenant, const std::string& sha256) {
  v1::UploadStatus status;
  status.set_sha256(sha256);
  auto model = metadata_->GetModel(tenant, ModelIdOf(sha256));
  if (model.ok()) {
    status.set_size(model->size());
    status.set_committed_size(model->size());
    status.set_model_id(model->id());
    return status;
  }
  auto committed = blobs_->UploadedSize(tenant, sha256);
  if (!committed.ok()) return committed.status();
  status.set_committed_size(*committed);
  return status;
}

absl::StatusOr<v1::Model> ModelRegistry::Get(const std::string& tenant, const std::string& id) {
  if (auto digest = DigestOfModelId(id); !digest.ok()) return digest.status();
  return metadata_->GetModel(tenant, id);
}

absl::StatusOr<store::ModelPage> ModelRegistry::List(const std::string& tenant, int page_size,
                                                     const std::string& page_token) {
  return metadata_->ListModels(tenant, page_size, page_token);
}

absl::Status ModelRegistry::Delete(const std::string& tenant, const std::string& id) {
  auto digest = DigestOfModelId(id);
  if (!digest.ok()) return digest.status();
  auto users = metadata_->CountJobsUsingModel(tenant, id, kActiveStates);
  if (!users.ok()) return users.status();
  if (*users > 0) {
    return absl::FailedPreconditionError(absl::StrCat("model ", id, " is used by ", *users, " queued or running job(s)"));
  }
  if (absl::Status deleted = metadata_->DeleteModel(tenant, id); !deleted.ok()) return deleted;
  auto kept = metadata_->ModelStoredByAnyTenant(id);
  auto referenced = metadata_->BlobReferenced(*digest);
  if (kept.ok() && !*kept && referenced.ok() && !*referenced) return blobs_->Remove(*digest);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ModelRegistry::DigestOf(const std::string& tenant, const std::string& id) {
  auto digest = DigestOfModelId(id);
  if (!digest.ok()) return digest.status();
  auto model = metadata_->GetModel(tenant, id);
  if (!model.ok()) return model.status();
  return digest;
}

}  // namespace recal::jobs
