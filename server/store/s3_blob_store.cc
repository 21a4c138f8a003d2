#include "server/store/s3_blob_store.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "server/store/fs_util.h"

namespace recal::store {
namespace {

using internal::CheckAdoptable;
using internal::DirectoryOf;
using internal::EnsureDirectory;
using internal::FsyncDirectory;
using internal::UnlinkIfPresent;

constexpr int64_t kMinPartBytes = int64_t{5} << 20;  // S3's rule for every part but the last

// Ranged GETs pinned to the ETag the reader was opened with, through a read-ahead window:
// a download asks for 1 MiB at a time, and one GET per MiB would be mostly round trips.
class S3BlobReader : public BlobReader {
 public:
  S3BlobReader(s3::S3Client* client, std::string bucket, std::string key, s3::ObjectMeta meta, int64_t window)
      : client_(client), bucket_(std::move(bucket)), key_(std::move(key)), meta_(std::move(meta)), window_(window) {}

  int64_t size() const override { return meta_.size; }

  absl::Status ReadAt(int64_t offset, int64_t max_bytes, std::string* out) const override {
    out->clear();
    if (offset < 0 || max_bytes < 0) return absl::InvalidArgumentError("negative offset or length");
    const int64_t want = std::min(max_bytes, std::max<int64_t>(0, meta_.size - offset));
    if (want == 0) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t buffered_end = buffer_offset_ + static_cast<int64_t>(buffer_.size());
    if (offset < buffer_offset_ || offset + want > buffered_end) {
      const int64_t fetch = std::min(std::max(want, window_), meta_.size - offset);
      buffer_.resize(static_cast<size_t>(fetch));
      absl::StatusOr<size_t> got =
          client_->ReadRange(bucket_, key_, offset, absl::MakeSpan(buffer_.data(), buffer_.size()), meta_.etag);
      if (!got.ok()) {
        buffer_.clear();
        return got.status();
      }
      if (static_cast<int64_t>(*got) != fetch) {
        buffer_.clear();
        return absl::DataLossError(absl::StrCat("s3://", bucket_, "/", key_, " ended at ", offset + *got,
                                                ", before its ", meta_.size, " bytes"));
      }
      buffer_offset_ = offset;
    }
    out->assign(buffer_.data() + (offset - buffer_offset_), static_cast<size_t>(want));
    return absl::OkStatus();
  }

 private:
  s3::S3Client* const client_;
  const std::string bucket_;
  const std::string key_;
  const s3::ObjectMeta meta_;
  const int64_t window_;
  mutable std::mutex mu_;
  mutable std::string buffer_;
  mutable int64_t buffer_offset_ = 0;
};

}  // namespace

S3BlobStore::S3BlobStore(std::unique_ptr<s3::S3Client> client, S3BlobStoreOptions options)
    : client_(std::move(client)),
      options_(std::move(options)),
      scratch_dir_(absl::StrCat(options_.local_dir, "/tmp")),
      cache_(absl::StrCat(options_.local_dir, "/cache/sha256"), options_.cache_bytes),
      uploads_(absl::StrCat(options_.local_dir, "/uploads")) {}

absl::StatusOr<std::unique_ptr<S3BlobStore>> S3BlobStore::Open(std::unique_ptr<s3::S3Client> client,
                                                               S3BlobStoreOptions options) {
  if (client == nullptr) return absl::InvalidArgumentError("S3 blob store without a client");
  RECAL_RETURN_IF_ERROR(s3::ValidateBucketName(options.location.bucket));
  if (options.local_dir.empty()) return absl::InvalidArgumentError("S3 blob store without a local directory");
  if (options.part_bytes < kMinPartBytes) {
    return absl::InvalidArgumentError(absl::StrCat("multipart part size ", options.part_bytes,
                                                   " is below S3's minimum of ", kMinPartBytes, " bytes"));
  }
  if (options.cache_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--blob_cache_bytes=", options.cache_bytes,
                                                   " is negative: give the bytes the model cache may take, or 0 for no bound"));
  }
  while (options.local_dir.size() > 1 && options.local_dir.back() == '/') options.local_dir.pop_back();
  const std::string& root = options.local_dir;
  for (const std::string& d : {root, absl::StrCat(root, "/uploads"), absl::StrCat(root, "/tmp"),
                               absl::StrCat(root, "/cache"), absl::StrCat(root, "/cache/sha256")}) {
    RECAL_RETURN_IF_ERROR(EnsureDirectory(d));
  }
  return std::unique_ptr<S3BlobStore>(new S3BlobStore(std::move(client), std::move(options)));
}

absl::Status S3BlobStore::Probe() const {
  // A GET of one key under the prefix rather than a listing: it needs no permission beyond
  // those the store uses, and its answer tells a missing bucket (NoSuchBucket) from a missing
  // key (NoSuchKey, the expected answer). The key is the empty blob's: there or not, both fine.
  absl::StatusOr<std::string> got = client_->GetObjectRange(options_.location.bucket, KeyOf(Sha256Hex("")), 0, 1);
  if (got.ok() || absl::IsOutOfRange(got.status())) return absl::OkStatus();
  if (absl::IsNotFound(got.status()) && !s3::IsNoSuchBucket(got.status())) return absl::OkStatus();
  return got.status();
}

std::string S3BlobStore::KeyOf(const std::string& sha256_hex) const {
  return absl::StrCat(options_.location.prefix, "blobs/sha256/", sha256_hex);
}

void S3BlobStore::TrimCache() {
  // A trim that fails (an entry that cannot be removed) leaves the cache over its bound until
  // the next one; the fetch or upload that came in is not the worse for it.
  cache_.Trim().IgnoreError();
}

absl::Status S3BlobStore::Named(const absl::Status& status, const std::string& sha256_hex) const {
  if (!absl::IsNotFound(status)) return status;
  return absl::NotFoundError(absl::StrCat("no blob sha256:", sha256_hex, ": ", status.message()));
}

bool S3BlobStore::Has(const std::string& sha256_hex) const {
  return IsSha256Hex(sha256_hex) && client_->HeadObject(options_.location.bucket, KeyOf(sha256_hex)).ok();
}

absl::StatusOr<int64_t> S3BlobStore::SizeOf(const std::string& sha256_hex) const {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  absl::StatusOr<s3::ObjectMeta> meta = client_->HeadObject(options_.location.bucket, KeyOf(sha256_hex));
  if (!meta.ok()) return Named(meta.status(), sha256_hex);
  return meta->size;
}

absl::StatusOr<std::unique_ptr<BlobReader>> S3BlobStore::OpenReader(const std::string& sha256_hex) const {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  const std::string key = KeyOf(sha256_hex);
  absl::StatusOr<s3::ObjectMeta> meta = client_->HeadObject(options_.location.bucket, key);
  if (!meta.ok()) return Named(meta.status(), sha256_hex);
  return std::make_unique<S3BlobReader>(client_.get(), options_.location.bucket, key, *std::move(meta),
                                        std::max<int64_t>(options_.read_ahead_bytes, 1));
}

absl::StatusOr<std::string> S3BlobStore::LocalPath(const std::string& sha256_hex) {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  // Only whole, verified files are ever renamed to an entry's name.
  if (std::optional<std::string> found = cache_.Find(sha256_hex)) return *std::move(found);
  std::string path = cache_.PathOf(sha256_hex);
  RECAL_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Open(path));
  Sha256 hash;
  absl::Status got = client_->GetObject(options_.location.bucket, KeyOf(sha256_hex), [&](absl::string_view piece) {
    hash.Update(piece);
    return writer.Append(piece);
  });
  if (!got.ok()) return Named(got, sha256_hex);  // the writer removes its temporary file
  if (const std::string actual = hash.HexDigest(); actual != sha256_hex) {
    return absl::DataLossError(absl::StrCat("s3://", options_.location.bucket, "/", KeyOf(sha256_hex),
                                            " does not hold the blob its key names: its bytes hash to ", actual));
  }
  RECAL_RETURN_IF_ERROR(writer.Commit());
  TrimCache();
  return path;
}

absl::StatusOr<BlobStore::HeldFile> S3BlobStore::HoldLocalPath(const std::string& sha256_hex) {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  // Held before it is looked up or fetched: no trim can come between.
  std::shared_ptr<void> hold = cache_.Hold(sha256_hex);
  RECAL_ASSIGN_OR_RETURN(std::string path, LocalPath(sha256_hex));
  return HeldFile{std::move(path), std::move(hold)};
}

absl::StatusOr<bool> S3BlobStore::Stored(const std::string& sha256_hex) const {
  absl::StatusOr<s3::ObjectMeta> there = client_->HeadObject(options_.location.bucket, KeyOf(sha256_hex));
  if (there.ok()) return true;
  // An endpoint that does not answer would not take the upload either: say so once, not after
  // a second round of retries. Anything else (a missing key; 403, which S3 answers for one
  // without s3:ListBucket) is left to the upload to settle.
  if (absl::IsUnavailable(there.status())) return there.status();
  return false;
}

absl::Status S3BlobStore::Upload(const std::string& sha256_hex, const std::string& path) {
  // Same key, same bytes: a blob already there is not sent again.
  RECAL_ASSIGN_OR_RETURN(const bool stored, Stored(sha256_hex));
  if (stored) return absl::OkStatus();
  return client_->UploadFile(options_.location.bucket, KeyOf(sha256_hex), path, options_.part_bytes).status();
}

absl::StatusOr<std::string> S3BlobStore::Put(absl::string_view bytes) {
  std::string hex = Sha256Hex(bytes);
  RECAL_ASSIGN_OR_RETURN(const bool stored, Stored(hex));
  if (stored) return hex;
  RECAL_RETURN_IF_ERROR(client_->PutObject(options_.location.bucket, KeyOf(hex), bytes).status());
  return hex;
}

absl::StatusOr<std::string> S3BlobStore::AdoptFile(const std::string& path) {
  RECAL_RETURN_IF_ERROR(CheckAdoptable(path));
  RECAL_ASSIGN_OR_RETURN(std::string hex, Sha256OfFile(path));
  RECAL_RETURN_IF_ERROR(Upload(hex, path));
  RECAL_RETURN_IF_ERROR(UnlinkIfPresent(path));
  return hex;
}

absl::Status S3BlobStore::Remove(const std::string& sha256_hex) {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  RECAL_RETURN_IF_ERROR(client_->DeleteObject(options_.location.bucket, KeyOf(sha256_hex)));
  return cache_.Remove(sha256_hex);
}

absl::StatusOr<int64_t> S3BlobStore::UploadedSize(const std::string& owner, const std::string& sha256_hex) const {
  return uploads_.UploadedSize(owner, sha256_hex);
}

absl::Status S3BlobStore::AppendUpload(const std::string& owner, const std::string& sha256_hex, int64_t offset,
                                       absl::string_view data, int64_t expected_size) {
  return uploads_.Append(owner, sha256_hex, offset, data, expected_size);
}

absl::StatusOr<std::string> S3BlobStore::CommitUpload(const std::string& owner, const std::string& sha256_hex,
                                                      int64_t expected_size) {
  const std::string cached = cache_.PathOf(sha256_hex);
  absl::StatusOr<bool> committed = uploads_.Commit(owner, sha256_hex, expected_size, [&](const std::string& verified) {
    // Into the bucket first: the staged file is dropped only once the blob is stored, so a
    // failure here (the endpoint down) leaves the upload whole, to be committed again.
    RECAL_RETURN_IF_ERROR(Upload(sha256_hex, verified));
    if (::rename(verified.c_str(), cached.c_str()) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot rename '", verified, "' to '", cached, "'"));
    }
    return FsyncDirectory(DirectoryOf(cached));
  });
  if (!committed.ok()) return committed.status();
  if (*committed) {
    TrimCache();
    return cached;
  }
  // A repeated commit (after a crash between the upload and the reply, or racing another
  // client's commit of the same bytes) succeeds.
  absl::StatusOr<std::string> stored = LocalPath(sha256_hex);
  if (absl::IsNotFound(stored.status())) return uploads_.Incomplete(owner, sha256_hex, expected_size);
  return stored;
}

absl::Status S3BlobStore::DiscardUpload(const std::string& owner, const std::string& sha256_hex) {
  return uploads_.Discard(owner, sha256_hex);
}

}  // namespace recal::store
