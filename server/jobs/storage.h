// What tenants store, in one place for the quota (ModelRegistry, the scheduler's results),
// GetUsage, the recal_store_bytes gauge and the retention sweeper: models and results as the
// metadata store records them, bytes on their way as it reserves them, uploads in progress as
// the blob store holds them; and the one rule for when a blob's bytes go.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/leases.h"
#include "server/jobs/scratch.h"
#include "server/store/blob_store.h"
#include "server/store/metadata_store.h"

namespace recal::jobs {

// The tenant's usage (max_stored_bytes is left for the caller to fill). stored_bytes is what
// the quota counts: models, results and reservations; uploads/upload_bytes are what this
// process's staging holds (covered by their reservations).
absl::StatusOr<v1::Usage> UsageOf(store::MetadataStore& metadata, const store::BlobStore& blobs,
                                  const std::string& tenant);

// Removes the blob unless some tenant's model or some job's result still references it.
// Deleting the rows that referenced it comes first, so a concurrent reference made after the
// check is the only window (as for models deleted by hand since they were introduced).
absl::Status RemoveBlobIfUnreferenced(store::MetadataStore& metadata, store::BlobStore& blobs,
                                      const std::string& sha256_hex);

// A tenant's max_stored_bytes (0: none), read at each call.
using StoredBytesLimitFn = std::function<int64_t(const std::string& tenant)>;

// max_stored_bytes held under concurrency, in one process or many (docs/retention.md): bytes
// are reserved in the metadata store, checked and taken in one transaction, before the first
// of them is written, and the reservation becomes the row that records them (PutModel,
// CommitJob). Two writers racing for a tenant's last bytes: exactly one gets them.
class StoredBytesQuota {
 public:
  StoredBytesQuota(store::MetadataStore* metadata, StoredBytesLimitFn limit)
      : metadata_(metadata), limit_(std::move(limit)) {}

  // An upload's whole declared size, from before its first byte until its model is stored or
  // it is refused. RESOURCE_EXHAUSTED (what the tenant would store, by part; its quota; what
  // to free) when it does not fit; a reservation the upload held already stays as it was.
  absl::Status ReserveUpload(const std::string& tenant, const v1::UploadHeader& header);
  // Before more of an upload's bytes are written or committed: its reservation is marked as in
  // use. false when it has gone meanwhile (expired while the upload sat idle, or turned into
  // the model by another client that finished the same bytes).
  absl::StatusOr<bool> TouchUpload(const std::string& tenant, const v1::UploadHeader& header);
  absl::Status ReleaseUpload(const std::string& tenant, const std::string& sha256_hex);
  // The bytes of the run's `files` in `scratch`, for the job's tenant, before they enter the
  // blob store (AdoptResults); they count until the job's row leaves RUNNING (the store drops
  // the reservation with the write that stores the results, or ends the job without them).
  absl::Status ReserveResults(const v1::Job& job, const std::filesystem::path& scratch, const ScratchFiles& files);
  // ReserveResults, asked again every 500 ms while the store is away (UNAVAILABLE: a restart)
  // and the run still holds its job (no lease lost, no cancel): the results are whole, and
  // failing the job for the store's absence would only run it again once its lease is gone.
  absl::Status ReserveResultsWhileHeld(const v1::Job& job, const std::filesystem::path& scratch,
                                       const ScratchFiles& files, const RunFlags& flags);

 private:
  // `what`: these bytes in the refusal ("this upload"); `fix`: what the tenant does then.
  absl::Status Reserve(const store::Reservation& reservation, absl::string_view what, absl::string_view fix);

  store::MetadataStore* const metadata_;
  const StoredBytesLimitFn limit_;
};

}  // namespace recal::jobs
