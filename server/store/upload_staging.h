// Uploads in progress, on a file system: <dir>/<owner>/<hex>.partial holds the bytes
// committed so far of an upload of digest <hex>. Both blob stores stage uploads here (the
// local one under its blob directory, so that replicas sharing it resume each other's
// uploads; the object-storage one on the local disk, see s3_blob_store.h) and differ only in
// where a verified upload goes on commit.
//
// Appends to one upload (and its commit or discard) are serialised with flock on the partial
// file, across threads and processes, so that "offset equals the committed size" is checked
// and acted on atomically.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/store/blob_store.h"

namespace recal::store {

class UploadStaging {
 public:
  // `dir` must exist.
  explicit UploadStaging(std::string dir) : dir_(std::move(dir)) {}

  // Owners, digests, offsets and sizes are checked here (INVALID_ARGUMENT); the contract is
  // BlobStore's (blob_store.h).
  absl::StatusOr<int64_t> UploadedSize(const std::string& owner, const std::string& sha256_hex) const;
  absl::Status Append(const std::string& owner, const std::string& sha256_hex, int64_t offset,
                      absl::string_view data, int64_t expected_size);
  // With the upload locked: verifies its digest (a mismatch discards it and is
  // INVALID_ARGUMENT), then calls `take` with the partial file's path; `take` moves or
  // removes the file (it is the verified blob) and its status is returned. false, with
  // nothing called, when no upload of this digest holds `expected_size` bytes: none is in
  // progress, or one that another client began after a racing commit took the complete one
  // (its partial file is left alone, not called corrupt).
  absl::StatusOr<bool> Commit(const std::string& owner, const std::string& sha256_hex, int64_t expected_size,
                              const std::function<absl::Status(const std::string& verified_path)>& take);
  // FAILED_PRECONDITION for a commit that found no complete upload and no stored blob, naming
  // the committed size to resume from.
  absl::Status Incomplete(const std::string& owner, const std::string& sha256_hex, int64_t expected_size) const;
  absl::Status Discard(const std::string& owner, const std::string& sha256_hex);
  // BlobStore's UploadUsageOf, UploadUsageByOwner and ExpireUploads. An upload's last append
  // is its file's modification time, on disk: expiry holds across restarts.
  absl::StatusOr<UploadUsage> UsageOf(const std::string& owner) const;
  absl::StatusOr<std::map<std::string, UploadUsage>> UsageByOwner() const;
  absl::StatusOr<int64_t> ExpireIdle(absl::Time idle_before);

 private:
  std::string PartialPath(const std::string& owner, const std::string& sha256_hex) const;
  const std::string dir_;
};

}  // namespace recal::store
