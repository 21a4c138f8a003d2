// Blobs on a local (or shared) file system, --blobs=file:DIR. Every write is atomic (temp
// file, fsync, rename): a blob is either whole under its digest or absent.
//   <dir>/blobs/sha256/<hex[0:2]>/<hex>
//   <dir>/uploads/<owner>/<hex>.partial  bytes committed so far of an upload (upload_staging.h)
//   <dir>/tmp/                           scratch: job outputs that AdoptFile renames into place
// Several hosts may share DIR (NFS, a ReadWriteMany volume): docs/cluster.md, "Blobs on a shared filesystem".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "server/store/blob_store.h"
#include "server/store/upload_staging.h"

namespace recal::store {

class LocalBlobStore : public BlobStore {
 public:
  static absl::StatusOr<std::unique_ptr<LocalBlobStore>> Open(const std::string& dir);

  // Where the blob with this hex digest lives (whether or not it exists).
  std::string PathOf(const std::string& sha256_hex) const;

  bool Has(const std::string& sha256_hex) const override;
  absl::StatusOr<int64_t> SizeOf(const std::string& sha256_hex) const override;
  // The blob stays readable while the reader is open, even if it is removed meanwhile.
  absl::StatusOr<std::unique_ptr<BlobReader>> OpenReader(const std::string& sha256_hex) const override;
  // PathOf, once the blob is there.
  absl::StatusOr<std::string> LocalPath(const std::string& sha256_hex) override;
  absl::StatusOr<std::string> Put(absl::string_view bytes) override;
  // A rename: the file must be on the store's file system (under scratch_dir()).
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
  std::string Describe() const override { return "file:" + dir_; }
  // <dir>/blobs: what the recal_store_bytes gauge sums.
  std::string blob_dir() const { return dir_ + "/blobs"; }

 private:
  explicit LocalBlobStore(std::string dir);
  std::string dir_;
  std::string scratch_dir_;
  UploadStaging uploads_;
};

}  // namespace recal::store
