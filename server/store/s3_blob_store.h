// Blobs in S3-compatible object storage, --blobs=s3://BUCKET/PREFIX (with the server's
// --s3_* flags: endpoint, region, addressing, credentials). One object per blob:
//   PREFIX/blobs/sha256/<hex>
// and, on this host's disk (under --data_dir, see main.cc), what cannot live in a bucket:
//   <local>/uploads/<owner>/<hex>.partial  uploads in progress (upload_staging.h)
//   <local>/tmp/                           scratch: job outputs that AdoptFile uploads
//   <local>/cache/sha256/<hex>             blobs fetched for LocalPath (models a job runs)
//
// Why so:
//  - An object appears only whole (S3 semantics: a PUT or a completed multipart upload is
//    atomic), and its key is the digest of bytes this process hashed before sending them, each
//    part signed with its own SHA-256 so that the server refuses a corrupted part: nothing
//    half-written or mislabelled is ever visible under a blob's key, whatever the moment this
//    process dies. An interrupted multipart upload leaves parts that are no object (a bucket
//    lifecycle rule, AbortIncompleteMultipartUpload, reclaims them; the client aborts them
//    itself on any error it sees).
//  - Uploads (UploadModel) arrive in 1 MiB chunks at offsets and must survive a crash with
//    their committed size, which S3 cannot append to: they are staged on the local disk as the
//    file store does, verified by their digest on commit, then streamed to the bucket (one
//    signed PUT up to part_bytes, multipart beyond; never the whole model in memory). The
//    verified file then becomes the local cache entry (the registry inspects the model there).
//    An upload is resumable on the replica that holds its staged bytes only: a client that
//    resumes on another api replica is told committed_size 0 there and uploads again from the
//    start (correct, only slower; a sticky load balancer avoids it).
//  - Results the engine wrote to scratch are hashed, then uploaded the same way (AdoptFile);
//    a blob already in the bucket is not sent again.
//  - The sandboxed worker reads its model from a local file and has no network: LocalPath
//    fetches the object into the cache (one streamed GET, resumed within the retry policy on
//    the first ETag), verifies its SHA-256, then renames it into place (atomic), so that a
//    cache entry is always whole and right. The cache is bounded (cache_bytes: the least
//    recently used entries leave first, never one a run holds; blob_cache.h), and Remove drops
//    an entry at once.
//  - Downloads read with ranged GETs pinned to the object's ETag (OpenReader / ReadAt, a read-
//    ahead window of a few MiB), so that a client's download resumes at any offset without the
//    server holding the blob. Has and SizeOf are HEADs; Remove is a DELETE (and drops the cache
//    entry).
//
// Errors (s3_client.h): a missing bucket or key is NOT_FOUND naming it, refused credentials
// PERMISSION_DENIED, an endpoint that does not answer UNAVAILABLE after the client's bounded
// retries (a job then fails with it; the server goes on). The endpoint and credentials are the
// server's configuration: keys are made only of the prefix and a checked digest, so no request
// can name another bucket, key or host.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "server/s3/s3_client.h"
#include "server/s3/s3_config.h"
#include "server/store/blob_cache.h"
#include "server/store/blob_store.h"
#include "server/store/upload_staging.h"

namespace recal::store {

struct S3BlobStoreOptions {
  s3::S3Location location;  // the bucket and the prefix the blobs go under
  std::string local_dir;    // staging, scratch and cache on this host (created if missing)
  // Larger blobs go as multipart uploads of this part size (S3's minimum is 5 MiB).
  int64_t part_bytes = int64_t{64} << 20;
  // Bytes a reader fetches per GET at least (downloads ask for 1 MiB at a time).
  int64_t read_ahead_bytes = int64_t{8} << 20;
  // What the cached blobs may take on this host's disk; 0: no bound.
  int64_t cache_bytes = 0;
};

class S3BlobStore : public BlobStore {
 public:
  // Makes the local directories; does not call the endpoint (see Probe).
  static absl::StatusOr<std::unique_ptr<S3BlobStore>> Open(std::unique_ptr<s3::S3Client> client,
                                                           S3BlobStoreOptions options);

  // One request to the bucket: NOT_FOUND naming a missing bucket, PERMISSION_DENIED, or
  // UNAVAILABLE when the endpoint does not answer. For the server's start.
  absl::Status Probe() const;

  // The object key of a blob.
  std::string KeyOf(const std::string& sha256_hex) const;

  bool Has(const std::string& sha256_hex) const override;
  absl::StatusOr<int64_t> SizeOf(const std::string& sha256_hex) const override;
  absl::StatusOr<std::unique_ptr<BlobReader>> OpenReader(const std::string& sha256_hex) const override;
  absl::StatusOr<std::string> LocalPath(const std::string& sha256_hex) override;
  absl::StatusOr<HeldFile> HoldLocalPath(const std::string& sha256_hex) override;
  absl::StatusOr<std::string> Put(absl::string_view bytes) override;
  absl::StatusOr<std::string> AdoptFile(const std::string& path) override;
  absl::Status Remove(const std::string& sha256_hex) override;

  absl::StatusOr<int64_t> UploadedSize(const std::string& owner, const std::string& sha256_hex) const override;
  absl::Status AppendUpload(const std::string& owner, const std::string& sha256_hex, int64_t offset,
                            absl::string_view data, int64_t expected_size) override;
  absl::StatusOr<std::string> CommitUpload(const std::string& owner, const std::string& sha256_hex,
                                           int64_t expected_size) override;
  absl::Status DiscardUpload(const std::string& owner, const std::string& sha256_hex) override;
  absl::StatusOr<UploadUsage> UploadUsageOf(const std::string& owner) const override {
    return uploads_.UsageOf(owner);
  }
  absl::StatusOr<std::map<std::string, UploadUsage>> UploadUsageByOwner() const override {
    return uploads_.UsageByOwner();
  }
  absl::StatusOr<int64_t> ExpireUploads(absl::Time idle_before) override { return uploads_.ExpireIdle(idle_before); }

  const std::string& scratch_dir() const override { return scratch_dir_; }
  std::string Describe() const override { return options_.location.ToString(); }

 private:
  S3BlobStore(std::unique_ptr<s3::S3Client> client, S3BlobStoreOptions options);
  // After an entry came into the cache.
  void TrimCache();
  // Whether the blob's object is there (a HEAD); UNAVAILABLE when the endpoint does not answer.
  absl::StatusOr<bool> Stored(const std::string& sha256_hex) const;
  // The file at `path` (hashed: `sha256_hex`) as the blob's object, unless it is there already.
  absl::Status Upload(const std::string& sha256_hex, const std::string& path);
  // NOT_FOUND from the bucket, said as a missing blob (keeping S3's words, which name the key).
  absl::Status Named(const absl::Status& status, const std::string& sha256_hex) const;

  std::unique_ptr<s3::S3Client> client_;
  const S3BlobStoreOptions options_;
  const std::string scratch_dir_;
  BlobCache cache_;
  UploadStaging uploads_;
};

}  // namespace recal::store
