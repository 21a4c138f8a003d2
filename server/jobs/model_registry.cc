#include "server/jobs/model_registry.h"

#include <google/protobuf/util/time_util.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/now.h"
#include "common/status_macros.h"
#include "server/jobs/model_ref.h"
#include "server/jobs/storage.h"

namespace recal::jobs {
namespace {

constexpr absl::string_view kIdPrefix = "sha256:";

// How many models an ambiguous digest prefix's error lists: enough to pick from, short
// enough to read.
constexpr int kMaxCandidates = 10;

// What the tenant does next when a reference finds nothing (only its own models are looked
// at, so nothing here says whether another tenant has one). Worded for any client: each adds
// its own command (recalctl: `recalctl list --models`).
constexpr absl::string_view kListHint = "; list your models to see their names and versions";

// "sha256:<hex> (name:version)", as a person picks a model from a list.
std::string Describe(const v1::Model& model) {
  return absl::StrCat(model.id(), " (", model.name(), ":", model.version(), ")");
}

}  // namespace

absl::StatusOr<std::string> DigestOfModelId(const std::string& id) {
  if (!absl::StartsWith(id, kIdPrefix)) {
    return absl::InvalidArgumentError(absl::StrCat("model id '", id, "' is not sha256:<hex>"));
  }
  return id.substr(kIdPrefix.size());
}

std::string ModelIdOf(const std::string& sha256_hex) { return absl::StrCat(kIdPrefix, sha256_hex); }

std::string ModelNameOf(const v1::UploadHeader& header) {
  return header.name().empty() ? std::string(store::kDefaultModelName) : header.name();
}

absl::StatusOr<std::optional<v1::Model>> ModelRegistry::StartUpload(const std::string& tenant,
                                                                    const v1::UploadHeader& header) {
  if (header.size() <= 0) return absl::InvalidArgumentError("upload header: size must be positive");
  RECAL_RETURN_IF_ERROR(CheckModelName(ModelNameOf(header)));
  if (header.size() > max_model_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("model of ", header.size(), " bytes exceeds the server's limit of ",
                                                     max_model_bytes_, " (--max_model_bytes)"));
  }
  auto existing = metadata_->GetModel(tenant, ModelIdOf(header.sha256()));
  if (existing.ok()) return std::optional<v1::Model>(*existing);
  if (existing.status().code() != absl::StatusCode::kNotFound) return existing.status();
  // Validates the digest's form (it names a file).
  RECAL_ASSIGN_OR_RETURN(const int64_t committed, blobs_->UploadedSize(tenant, header.sha256()));
  if (disk_floor_ != nullptr) RECAL_RETURN_IF_ERROR(disk_floor_->Admit(header.size() - committed));
  // Counted from before its first byte: begun and abandoned, an upload would otherwise hold
  // bytes outside the quota until it expires, and uploads begun at once would all fit.
  RECAL_RETURN_IF_ERROR(stored_bytes_.ReserveUpload(tenant, header));
  return std::optional<v1::Model>();
}

absl::Status ModelRegistry::AppendChunk(const std::string& tenant, const v1::UploadHeader& header,
                                        const v1::UploadChunk& chunk) {
  if (disk_floor_ != nullptr) RECAL_RETURN_IF_ERROR(disk_floor_->Admit(static_cast<int64_t>(chunk.data().size())));
  RECAL_RETURN_IF_ERROR(KeepReserved(tenant, header));
  absl::Status appended =
      blobs_->AppendUpload(tenant, header.sha256(), chunk.offset(), chunk.data(), header.size());
  // A full disk removed the upload's staged bytes (UploadStaging): nothing is left to count.
  if (!appended.ok()) ReleaseIfNothingStaged(tenant, header);
  return appended;
}

absl::Status ModelRegistry::KeepReserved(const std::string& tenant, const v1::UploadHeader& header) {
  RECAL_ASSIGN_OR_RETURN(const bool held, stored_bytes_.TouchUpload(tenant, header));
  if (held) return absl::OkStatus();
  // Another client finished the same bytes meanwhile (its model row took the reservation):
  // these staged bytes are not needed, and the client finds the model by asking again.
  if (metadata_->GetModel(tenant, ModelIdOf(header.sha256())).ok()) {
    blobs_->DiscardUpload(tenant, header.sha256()).IgnoreError();  // else it expires
    return absl::FailedPreconditionError(absl::StrCat(
        "sha256:", header.sha256(), " was stored meanwhile by another upload of the same bytes; "
        "GetUploadStatus names the model"));
  }
  // Expired while the upload sat idle: taken again, checked.
  return stored_bytes_.ReserveUpload(tenant, header);
}

void ModelRegistry::LeaveUpload(const std::string& tenant, const v1::UploadHeader& header) {
  ReleaseIfNothingStaged(tenant, header);
}

void ModelRegistry::ReleaseIfNothingStaged(const std::string& tenant, const v1::UploadHeader& header) {
  // A committed blob without its model (a worker went away mid-inspection) is the retry's, and
  // stays counted.
  if (blobs_->UploadedSize(tenant, header.sha256()).value_or(-1) != 0 || blobs_->Has(header.sha256())) return;
  stored_bytes_.ReleaseUpload(tenant, header.sha256()).IgnoreError();  // expires if this fails
}

// Holds the one turn to finish a tenant's upload of some bytes in this process (api replicas
// apart still meet in the blob store, whose commit tolerates a race: see CommitUpload).
class ModelRegistry::FinishTurn {
 public:
  FinishTurn(ModelRegistry* registry, std::string key) : registry_(registry), key_(std::move(key)) {
    std::unique_lock<std::mutex> lock(registry_->finishing_mu_);
    registry_->finishing_done_.wait(lock, [&] { return registry_->finishing_.count(key_) == 0; });
    registry_->finishing_.insert(key_);
  }
  ~FinishTurn() {
    {
      std::lock_guard<std::mutex> lock(registry_->finishing_mu_);
      registry_->finishing_.erase(key_);
    }
    registry_->finishing_done_.notify_all();
  }
  FinishTurn(const FinishTurn&) = delete;
  FinishTurn& operator=(const FinishTurn&) = delete;

 private:
  ModelRegistry* registry_;
  std::string key_;
};

absl::StatusOr<v1::Model> ModelRegistry::FinishUpload(const std::string& tenant, const v1::UploadHeader& header) {
  FinishTurn turn(this, absl::StrCat(tenant, "/", header.sha256()));
  // Another client's finish of the same bytes, which this one waited for, may have stored them.
  absl::StatusOr<v1::Model> stored = metadata_->GetModel(tenant, ModelIdOf(header.sha256()));
  if (stored.ok() || !absl::IsNotFound(stored.status())) return stored;
  return CommitAndInspect(tenant, header);
}

absl::StatusOr<v1::Model> ModelRegistry::CommitAndInspect(const std::string& tenant,
                                                          const v1::UploadHeader& header) {
  auto committed = blobs_->UploadedSize(tenant, header.sha256());
  if (!committed.ok()) return committed.status();
  if (*committed != header.size()) {
    return absl::FailedPreconditionError(absl::StrCat("upload incomplete: ", *committed, " of ", header.size(),
                                                      " bytes committed; resume from ", *committed));
  }
  // Before the commit: a refusal here leaves the staged bytes (and their reservation) to
  // finish again later.
  const int tenant_limit = static_cast<int>(Limits(tenant).max_concurrent_inspections);
  RECAL_ASSIGN_OR_RETURN(InspectionSlots::Slot slot, tenant_inspections_->Acquire(tenant, 0, tenant_limit));
  RECAL_ASSIGN_OR_RETURN(std::unique_ptr<ModelInspector::Room> room, runner_->Reserve(header.size()));
  // The bytes stay counted through the commit and the inspection, until PutModel turns the
  // reservation into the model's row.
  RECAL_RETURN_IF_ERROR(KeepReserved(tenant, header));
  auto path = blobs_->CommitUpload(tenant, header.sha256(), header.size());
  if (absl::IsInvalidArgument(path.status())) {  // corrupt: the staged bytes were discarded
    stored_bytes_.ReleaseUpload(tenant, header.sha256()).IgnoreError();  // expires if this fails
  }
  if (!path.ok()) return path.status();
  auto inspected = room->Inspect(*path);
  // Nothing could inspect it after all (a worker that went away mid-inspection): the model
  // is not refused; the committed blob and the reservation stay for the retried upload
  // (whose commit finds the blob), or until the reservation expires.
  if (absl::IsResourceExhausted(inspected.status()) || absl::IsUnavailable(inspected.status())) {
    return inspected.status();
  }
  if (!inspected.ok()) return Refuse(tenant, header, inspected.status());
  v1::Model model = *std::move(inspected);  // its layers and inputs
  model.set_id(ModelIdOf(header.sha256()));
  model.set_tenant(tenant);
  model.set_name(ModelNameOf(header));
  model.set_size(header.size());
  model.mutable_labels()->insert(header.labels().begin(), header.labels().end());
  *model.mutable_create_time() = NowTimestamp();
  return metadata_->PutModel(model);
}

absl::Status ModelRegistry::Refuse(const std::string& tenant, const v1::UploadHeader& header,
                                   const absl::Status& verdict) {
  // Not kept: nothing may refer to a model that was refused (unless the same bytes are
  // another tenant's already, and thus were accepted before).
  auto kept = metadata_->ModelStoredByAnyTenant(ModelIdOf(header.sha256()));
  if (kept.ok() && !*kept) blobs_->Remove(header.sha256()).IgnoreError();
  stored_bytes_.ReleaseUpload(tenant, header.sha256()).IgnoreError();  // expires if this fails
  return absl::InvalidArgumentError(absl::StrCat("model refused: ", verdict.message()));
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

absl::StatusOr<v1::Model> ModelRegistry::Resolve(const std::string& tenant, const std::string& reference) {
  RECAL_ASSIGN_OR_RETURN(const ModelRef ref, ParseModelRef(reference));
  absl::StatusOr<v1::Model> model;
  switch (ref.kind) {
    case ModelRef::Kind::kId:
      model = metadata_->GetModel(tenant, ModelIdOf(ref.digest));
      break;
    case ModelRef::Kind::kName:
      model = metadata_->GetModelVersion(tenant, ref.name, ref.version);
      break;
    case ModelRef::Kind::kPrefix:
      return ResolvePrefix(tenant, reference, ref.digest);
  }
  if (absl::IsNotFound(model.status())) {
    return absl::NotFoundError(absl::StrCat(model.status().message(), kListHint));
  }
  return model;
}

absl::StatusOr<v1::Model> ModelRegistry::ResolvePrefix(const std::string& tenant, const std::string& reference,
                                                       const std::string& hex) {
  RECAL_ASSIGN_OR_RETURN(std::vector<v1::Model> found,
                         metadata_->FindModelsByDigestPrefix(tenant, hex, kMaxCandidates + 1));
  if (found.empty()) return absl::NotFoundError(absl::StrCat("no model's digest starts with ", hex, kListHint));
  if (found.size() == 1) return std::move(found.front());
  std::string candidates;
  for (size_t i = 0; i < found.size() && i < kMaxCandidates; ++i) {
    absl::StrAppend(&candidates, i == 0 ? "" : ", ", Describe(found[i]));
  }
  if (found.size() > kMaxCandidates) absl::StrAppend(&candidates, ", and more");
  return absl::InvalidArgumentError(absl::StrCat("model '", reference, "' is ambiguous: the digests of ",
                                                 found.size() > kMaxCandidates ? "more than " : "",
                                                 std::min<size_t>(found.size(), kMaxCandidates),
                                                 " models start with it: ", candidates,
                                                 "; give more digits, or NAME:VERSION"));
}

absl::StatusOr<store::ModelPage> ModelRegistry::List(const std::string& tenant, int page_size,
                                                     const std::string& page_token, const std::string& name) {
  return metadata_->ListModels(tenant, page_size, page_token, name);
}

absl::StatusOr<v1::Model> ModelRegistry::Delete(const std::string& tenant, const std::string& reference) {
  RECAL_ASSIGN_OR_RETURN(v1::Model model, Resolve(tenant, reference));
  RECAL_ASSIGN_OR_RETURN(const std::string digest, DigestOfModelId(model.id()));
  // Jobs keep full ids (JobManager::Submit resolves them), so this counts the jobs submitted
  // with any reference to these bytes, in the transaction that deletes the model.
  RECAL_ASSIGN_OR_RETURN(const int64_t users, metadata_->DeleteModelUnlessUsed(tenant, model.id()));
  if (users > 0) {
    return absl::FailedPreconditionError(absl::StrCat("model ", Describe(model), " is used by ", users,
                                                      " queued or running job(s); cancel them or wait for them "
                                                      "to end, then delete it"));
  }
  RECAL_RETURN_IF_ERROR(RemoveBlobIfUnreferenced(*metadata_, *blobs_, digest));
  return model;
}

absl::StatusOr<v1::Usage> ModelRegistry::Usage(const std::string& tenant) {
  RECAL_ASSIGN_OR_RETURN(v1::Usage usage, UsageOf(*metadata_, *blobs_, tenant));
  usage.set_max_stored_bytes(Limits(tenant).max_stored_bytes);
  return usage;
}

absl::StatusOr<std::string> ModelRegistry::DigestOf(const std::string& tenant, const std::string& id) {
  auto digest = DigestOfModelId(id);
  if (!digest.ok()) return digest.status();
  auto model = metadata_->GetModel(tenant, id);
  if (!model.ok()) return model.status();
  return digest;
}

}  // namespace recal::jobs
