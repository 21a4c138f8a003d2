// Content-addressed blobs (models, results), and uploads in progress: the interface the job
// and API layers use. Two implementations, chosen by --blobs:
//   LocalBlobStore (local_blob_store.h)  file:DIR, a local or shared file system;
//   S3BlobStore (s3_blob_store.h)        s3://BUCKET/PREFIX, S3-compatible object storage.
// Both keep the same contract (tests/store/blob_store_conformance_test.cc runs one suite
// against each): a blob is either whole under its digest or absent, never half-written; an
// upload is verified against its digest before it becomes a blob; digests (64 lowercase hex
// characters) and owners (tenant names) are checked before they name anything.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace recal::store {

// An owner's uploads in progress: how many, and their committed bytes (what is on disk).
struct UploadUsage {
  int64_t uploads = 0;
  int64_t bytes = 0;
};

// One blob's bytes, read at any offset (downloads resume mid-blob).
class BlobReader {
 public:
  virtual ~BlobReader() = default;
  virtual int64_t size() const = 0;
  // Up to `max_bytes` from `offset` into `out` (fewer only at the end; none past it).
  // Thread-compatible: one reader serves one download.
  virtual absl::Status ReadAt(int64_t offset, int64_t max_bytes, std::string* out) const = 0;
};

class BlobStore {
 public:
  virtual ~BlobStore() = default;

  // Whether the blob is known to be there (false also when the store cannot tell, e.g. an
  // endpoint that does not answer: callers only use it to skip a write that would be redundant).
  virtual bool Has(const std::string& sha256_hex) const = 0;
  virtual absl::StatusOr<int64_t> SizeOf(const std::string& sha256_hex) const = 0;  // NOT_FOUND
  virtual absl::StatusOr<std::unique_ptr<BlobReader>> OpenReader(const std::string& sha256_hex) const = 0;  // NOT_FOUND
  // A file on this host's disk holding the blob's bytes, for what must read a local file
  // (the sandboxed worker opens the model by path). For object storage the blob is fetched
  // into a local cache first (verified by its digest). NOT_FOUND when absent.
  virtual absl::StatusOr<std::string> LocalPath(const std::string& sha256_hex) = 0;
  // LocalPath's file, kept until `hold` goes: for what opens it again later (a job's run), where
  // a store that keeps a bounded cache of local copies (S3BlobStore) could remove it meanwhile.
  struct HeldFile {
    std::string path;
    std::shared_ptr<void> hold;
  };
  virtual absl::StatusOr<HeldFile> HoldLocalPath(const std::string& sha256_hex);

  // Stores `bytes` and returns their hex digest.
  virtual absl::StatusOr<std::string> Put(absl::string_view bytes) = 0;
  // Takes a complete file (one the engine wrote under scratch_dir()) into the store under its
  // digest, computed here, and removes it; returns the digest. Refuses anything but a plain
  // file with one link (FAILED_PRECONDITION): a worker could otherwise make a blob of a file
  // it cannot read.
  virtual absl::StatusOr<std::string> AdoptFile(const std::string& path) = 0;
  virtual absl::Status Remove(const std::string& sha256_hex) = 0;  // OK if absent

  // Uploads, each kept apart under its `owner` (a tenant name: [A-Za-z0-9][A-Za-z0-9_.-]*,
  // at most 64). Appends are durable (fsync) before they return, so the committed size
  // survives a crash. AppendUpload refuses an offset past the committed size
  // (FAILED_PRECONDITION, naming the committed size) and growth past `expected_size`
  // (INVALID_ARGUMENT); of a chunk that starts below the committed size only the bytes past
  // it are written (clients racing over the same upload send the same bytes).
  virtual absl::StatusOr<int64_t> UploadedSize(const std::string& owner, const std::string& sha256_hex) const = 0;  // 0 if none
  virtual absl::Status AppendUpload(const std::string& owner, const std::string& sha256_hex, int64_t offset,
                                    absl::string_view data, int64_t expected_size) = 0;
  // Verifies the digest of the complete upload of `expected_size` bytes (INVALID_ARGUMENT on
  // mismatch, and the partial upload is discarded) and stores it as a blob. Returns
  // LocalPath() of the blob (the registry inspects the model there). A repeated or racing
  // commit of a stored blob succeeds and leaves any upload begun since alone;
  // FAILED_PRECONDITION, naming the committed size, when neither a complete upload nor the
  // blob exists.
  virtual absl::StatusOr<std::string> CommitUpload(const std::string& owner, const std::string& sha256_hex,
                                                   int64_t expected_size) = 0;
  virtual absl::Status DiscardUpload(const std::string& owner, const std::string& sha256_hex) = 0;
  // What uploads in progress hold: one owner's, and every owner's that has any.
  virtual absl::StatusOr<UploadUsage> UploadUsageOf(const std::string& owner) const = 0;
  virtual absl::StatusOr<std::map<std::string, UploadUsage>> UploadUsageByOwner() const = 0;
  // Removes every upload not appended to since `idle_before` (abandoned: an append after it
  // finds nothing committed and is told to resume at offset 0). Safe beside appends and
  // beside another process expiring the same uploads. Returns how many it removed.
  virtual absl::StatusOr<int64_t> ExpireUploads(absl::Time idle_before) = 0;

  // A local directory for temporary files that AdoptFile will take (job scratch dirs).
  virtual const std::string& scratch_dir() const = 0;
  // Where the blobs live, for logs: "file:DIR", "s3://BUCKET/PREFIX/" (never a credential).
  virtual std::string Describe() const = 0;
};

// INVALID_ARGUMENT unless `hex` is a SHA-256 digest as Sha256 prints it. Digests come from
// clients and become file names and object keys, so this check is also what keeps a request
// from naming a path outside the store ("../x", "/etc/passwd", ...).
absl::Status ValidateDigest(const std::string& hex);

}  // namespace recal::store
