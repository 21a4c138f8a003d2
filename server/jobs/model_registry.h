// Models: content-addressed uploads (resumable, digest verified, inspected before they are
// accepted) with a name and a version per tenant; references resolved to exact bytes
// (model_ref.h, docs/models.md), listing and deletion.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/inspection_slots.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/model_inspector.h"
#include "server/jobs/storage.h"
#include "server/store/blob_store.h"
#include "server/store/disk_floor.h"
#include "server/store/metadata_store.h"

namespace recal::jobs {

// What one tenant may hold and do; 0 = no limit. Read at each call, so that a reloaded
// auth file applies at once.
struct TenantLimits {
  int64_t max_active_jobs = 0;             // queued + running
  int64_t max_stored_bytes = 0;            // models, results and unfinished uploads
  int64_t max_submissions_per_minute = 0;
  int64_t max_concurrent_inspections = 0;  // uploads being inspected at once; 0: no bound
  int64_t max_running_jobs = 0;            // jobs and shards holding a worker at once; 0: no bound
};
using TenantLimitsFn = std::function<TenantLimits(const std::string& tenant)>;

// Every call names the tenant it acts for: a tenant sees only its own models; another
// tenant's model answers exactly as a model that does not exist (references are resolved
// among the tenant's own models only).
class ModelRegistry {
 public:
  // `runner` validates and inspects every upload (the server never loads a model itself):
  // a local WorkerRunner, or on an api replica a worker process of the cluster.
  ModelRegistry(store::MetadataStore* metadata, store::BlobStore* blobs, int64_t max_model_bytes,
                ModelInspector* runner, TenantLimitsFn limits = nullptr)
      : metadata_(metadata),
        blobs_(blobs),
        max_model_bytes_(max_model_bytes),
        runner_(runner),
        limits_(std::move(limits)),
        stored_bytes_(metadata, [this](const std::string& tenant) { return Limits(tenant).max_stored_bytes; }),
        tenant_inspections_(std::make_unique<InspectionSlots>(InspectionBounds{})) {}

  // Uploads waiting for, or refused, one of their tenant's inspection slots (metrics).
  const InspectionSlots& tenant_inspections() const { return *tenant_inspections_; }
  // How long an upload waits for one of its tenant's inspection slots (default 2 minutes);
  // set before serving.
  void SetInspectionWait(absl::Duration max_wait) {
    tenant_inspections_ = std::make_unique<InspectionSlots>(InspectionBounds{0, 0, 0, max_wait});
  }

  // The free-space floor uploads are staged under (null: none); set before serving.
  void SetDiskFloor(const store::DiskFloor* floor) { disk_floor_ = floor; }
  // The tenants' max_stored_bytes, which the scheduler also reserves job results under.
  StoredBytesQuota& stored_bytes() { return stored_bytes_; }

  // Checks the header (its name: CheckModelName; the disk floor) and reserves the upload's
  // whole size in the tenant's stored-bytes quota (StoredBytesQuota::ReserveUpload), held
  // until its model is stored or it is refused (or expires). Returns the model if the tenant
  // has these bytes already (nothing to upload; it keeps the name and version it has),
  // std::nullopt if the upload should proceed.
  absl::StatusOr<std::optional<v1::Model>> StartUpload(const std::string& tenant, const v1::UploadHeader& header);
  // Refused below the disk floor; a chunk that finds the disk full ends the upload (its
  // staged bytes and its reservation go).
  absl::Status AppendChunk(const std::string& tenant, const v1::UploadHeader& header, const v1::UploadChunk& chunk);
  // The client's stream ended before the upload was finished (an error, a hang-up). With
  // nothing staged it holds no reservation, as if never begun; with bytes staged it keeps its
  // own, for the resume, until it expires.
  void LeaveUpload(const std::string& tenant, const v1::UploadHeader& header);
  // Once every byte is committed: verifies the digest, loads the archive, validates its
  // graphs, inspects it, and stores the model as the next version of its name. Clients that
  // finish the same bytes of one tenant at once are served one at a time: those after the
  // first get the model it stored, without a second inspection. The upload's reservation
  // becomes the model row; a refused model's goes with its bytes.
  absl::StatusOr<v1::Model> FinishUpload(const std::string& tenant, const v1::UploadHeader& header);
  absl::StatusOr<v1::UploadStatus> UploadStatus(const std::string& tenant, const std::string& sha256);

  // The tenant's model that `reference` names (model_ref.h): INVALID_ARGUMENT for a malformed
  // reference or a digest prefix several of the tenant's models share (listing them),
  // NOT_FOUND saying what was looked for. Where a request names a model, this is the one
  // place it is resolved; what is kept afterwards is the model's full id.
  absl::StatusOr<v1::Model> Resolve(const std::string& tenant, const std::string& reference);
  // Newest first. `tenant` empty: every tenant's (for admins); `name` not empty: its versions.
  absl::StatusOr<store::ModelPage> List(const std::string& tenant, int page_size, const std::string& page_token,
                                        const std::string& name);
  // Deletes the model `reference` names (as Resolve) and returns it. FAILED_PRECONDITION
  // while a queued or running job of the tenant uses it. The bytes go once no tenant's model
  // or result needs them. Its version number is never given to other bytes.
  absl::StatusOr<v1::Model> Delete(const std::string& tenant, const std::string& reference);

  // What the tenant stores against its max_stored_bytes quota (storage.h's UsageOf, with the
  // quota filled in): the quota this registry checks at every upload and chunk.
  absl::StatusOr<v1::Usage> Usage(const std::string& tenant);

  // The digest of the stored model with full id `id` (as a job keeps it; NOT_FOUND if the
  // tenant has no such model; UNAVAILABLE while the metadata store is away). Its archive is
  // BlobStore::LocalPath of it.
  absl::StatusOr<std::string> DigestOf(const std::string& tenant, const std::string& id);

 private:
  class FinishTurn;
  absl::StatusOr<v1::Model> CommitAndInspect(const std::string& tenant, const v1::UploadHeader& header);
  // What a refused model leaves: nothing (its blob unless another row references the bytes,
  // its reservation); INVALID_ARGUMENT saying why.
  absl::Status Refuse(const std::string& tenant, const v1::UploadHeader& header, const absl::Status& verdict);
  TenantLimits Limits(const std::string& tenant) const { return limits_ ? limits_(tenant) : TenantLimits{}; }
  void ReleaseIfNothingStaged(const std::string& tenant, const v1::UploadHeader& header);
  // Before more of an upload's bytes are written or committed: its reservation is marked as in
  // use, or taken again (checked) if it expired. FAILED_PRECONDITION when another client
  // stored the same bytes meanwhile.
  absl::Status KeepReserved(const std::string& tenant, const v1::UploadHeader& header);
  // The one model of the tenant whose digest starts with `hex` (Resolve of a prefix).
  absl::StatusOr<v1::Model> ResolvePrefix(const std::string& tenant, const std::string& reference,
                                          const std::string& hex);

  store::MetadataStore* metadata_;
  store::BlobStore* blobs_;
  const int64_t max_model_bytes_;
  ModelInspector* runner_;
  TenantLimitsFn limits_;
  StoredBytesQuota stored_bytes_;
  const store::DiskFloor* disk_floor_ = nullptr;
  // Each tenant's concurrent inspections (TenantLimits::max_concurrent_inspections); the
  // host's bound is the runner's.
  std::unique_ptr<InspectionSlots> tenant_inspections_;
  // "tenant/digest" of the uploads being finished (FinishTurn).
  std::mutex finishing_mu_;
  std::condition_variable finishing_done_;
  std::set<std::string> finishing_;
};

// "sha256:<hex>" <-> "<hex>"; INVALID_ARGUMENT for anything else.
absl::StatusOr<std::string> DigestOfModelId(const std::string& id);
std::string ModelIdOf(const std::string& sha256_hex);
// The name an upload stores: its header's, or store::kDefaultModelName for none.
std::string ModelNameOf(const v1::UploadHeader& header);

}  // namespace recal::jobs
