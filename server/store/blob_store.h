// Content-addressed blobs on local disk, and uploads in progress. Every write is atomic
// (temp file, fsync, rename): a blob is either whole under its digest or absent.
//   <dir>/blobs/sha256/<hex[0:2]>/<hex>
//   <dir>/uploads/<owner>/<hex>.partial  bytes committed so far of an upload of digest <hex>
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal::store {

// One blob's bytes, read at any offset (downloads resume mid-blob). The blob stays
// readable while the reader is open, even if it is removed meanwhile.
class BlobReader {
 public:
  ~BlobReader();
  BlobReader(const BlobReader&) = delete;
  BlobReader& operator=(const BlobReader&) = delete;

  int64_t size() const { return size_; }
  // Up to `max_bytes` from `offset` into `out` (fewer only at the end; none past it).
  absl::Status ReadAt(int64_t offset, int64_t max_bytes, std::string* out) const;

 private:
  friend class BlobStore;
  BlobReader(int fd, int64_t size, std::string name) : fd_(fd), size_(size), name_(std::move(name)) {}
  const int fd_;
  const int64_t size_;
  const std::string name_;
};

class BlobStore {
 public:
  static absl::StatusOr<std::unique_ptr<BlobStore>> Open(const std::string& dir);

  // Where the blob with this hex digest lives (whether or not it exists).
  std::string PathOf(const std::string& sha256_hex) const;
  bool Has(const std::string& sha256_hex) const;
  absl::StatusOr<int64_t> SizeOf(const std::string& sha256_hex) const;  // NOT_FOUND
  absl::StatusOr<std::unique_ptr<BlobReader>> OpenReader(const std::string& sha256_hex) const;  // NOT_FOUND

  // Stores `bytes` and returns their hex digest.
  absl::StatusOr<std::string> Put(absl::string_view bytes);
  // Moves a complete file (e.g. one the engine wrote next to the store) into the store
  // under its digest, computed here; returns the digest.
  absl::StatusOr<std::string> AdoptFile(const std::string& path);
  absl::Status Remove(const std::string& sha256_hex);  // OK if absent

  // Uploads, each kept apart under its `owner` (a tenant name: [A-Za-z0-9][A-Za-z0-9_.-]*,
  // at most 64). Appends are durable (fsync) before they return, so committed size survives
  // a crash. AppendUpload refuses an offset other than the committed size
  // (FAILED_PRECONDITION, naming the committed size) and growth past `expected_size`
  // (INVALID_ARGUMENT).
  absl::StatusOr<int64_t> UploadedSize(const std::string& owner, const std::string& sha256_hex) const;  // 0 if none
  absl::Status AppendUpload(const std::string& owner, const std::string& sha256_hex, int64_t offset,
                            absl::string_view data, int64_t expected_size);
  // Verifies the digest of the complete upload (INVALID_ARGUMENT on mismatch, and the
  // partial file is discarded) and moves it into the store. Returns the blob's path.
  absl::StatusOr<std::string> CommitUpload(const std::string& owner, const std::string& sha256_hex);
  absl::Status DiscardUpload(const std::string& owner, const std::string& sha256_hex);

  // A directory on the same file system for temporary files that AdoptFile will take.
  const std::string& scratch_dir() const { return scratch_dir_; }

 private:
  explicit BlobStore(std::string dir);
  std::string dir_;
  std::string scratch_dir_;
};

}  // namespace recal::store
