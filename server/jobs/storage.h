// What tenants store, in one place for the quota (ModelRegistry), GetUsage, the
// recal_store_bytes gauge and the retention sweeper: models and results as the metadata
// store records them, uploads in progress as the blob store holds them; and the one rule for
// when a blob's bytes go.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "server/store/blob_store.h"
#include "server/store/metadata_store.h"

namespace recal::jobs {

// The tenant's usage (max_stored_bytes is left for the caller to fill).
absl::StatusOr<v1::Usage> UsageOf(store::MetadataStore& metadata, const store::BlobStore& blobs,
                                  const std::string& tenant);

// Removes the blob unless some tenant's model or some job's result still references it.
// Deleting the rows that referenced it comes first, so a concurrent reference made after the
// check is the only window (as for models deleted by hand since they were introduced).
absl::Status RemoveBlobIfUnreferenced(store::MetadataStore& metadata, store::BlobStore& blobs,
                                      const std::string& sha256_hex);

}  // namespace recal::jobs
