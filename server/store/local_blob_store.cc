#include "server/store/local_blob_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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
using internal::Exists;
using internal::FsyncDirectory;
using internal::FsyncFile;
using internal::UnlinkIfPresent;

// A blob file, read with pread: the open descriptor keeps it readable after an unlink.
class FileBlobReader : public BlobReader {
 public:
  FileBlobReader(int fd, int64_t size, std::string name) : fd_(fd), size_(size), name_(std::move(name)) {}
  ~FileBlobReader() override { ::close(fd_); }
  FileBlobReader(const FileBlobReader&) = delete;
  FileBlobReader& operator=(const FileBlobReader&) = delete;

  int64_t size() const override { return size_; }

  absl::Status ReadAt(int64_t offset, int64_t max_bytes, std::string* out) const override {
    out->clear();
    if (offset < 0 || max_bytes < 0) return absl::InvalidArgumentError("negative offset or length");
    const int64_t want = std::min(max_bytes, std::max<int64_t>(0, size_ - offset));
    out->resize(static_cast<size_t>(want));
    int64_t done = 0;
    while (done < want) {
      const ssize_t got = ::pread(fd_, out->data() + done, static_cast<size_t>(want - done), offset + done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot read blob ", name_));
      if (got == 0) return absl::DataLossError(absl::StrCat("blob ", name_, " is shorter than its ", size_, " bytes"));
      done += got;
    }
    return absl::OkStatus();
  }

 private:
  const int fd_;
  const int64_t size_;
  const std::string name_;
};

}  // namespace

LocalBlobStore::LocalBlobStore(std::string dir)
    : dir_(std::move(dir)), scratch_dir_(absl::StrCat(dir_, "/tmp")), uploads_(absl::StrCat(dir_, "/uploads")) {}

absl::StatusOr<std::unique_ptr<LocalBlobStore>> LocalBlobStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("blob store directory is empty");
  std::string root = dir;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  for (const std::string& d : {root, absl::StrCat(root, "/blobs"), absl::StrCat(root, "/blobs/sha256"),
                               absl::StrCat(root, "/uploads"), absl::StrCat(root, "/tmp")}) {
    RECAL_RETURN_IF_ERROR(EnsureDirectory(d));
  }
  return std::unique_ptr<LocalBlobStore>(new LocalBlobStore(std::move(root)));
}

std::string LocalBlobStore::PathOf(const std::string& sha256_hex) const {
  return absl::StrCat(dir_, "/blobs/sha256/", sha256_hex.substr(0, 2), "/", sha256_hex);
}

bool LocalBlobStore::Has(const std::string& sha256_hex) const {
  return IsSha256Hex(sha256_hex) && Exists(PathOf(sha256_hex));
}

absl::StatusOr<int64_t> LocalBlobStore::SizeOf(const std::string& sha256_hex) const {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  struct stat st;
  if (::stat(PathOf(sha256_hex).c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no blob sha256:", sha256_hex));
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat blob '", PathOf(sha256_hex), "'"));
  }
  return static_cast<int64_t>(st.st_size);
}

absl::StatusOr<std::unique_ptr<BlobReader>> LocalBlobStore::OpenReader(const std::string& sha256_hex) const {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  const int fd = ::open(PathOf(sha256_hex).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no blob sha256:", sha256_hex));
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open blob sha256:", sha256_hex));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::ErrnoToStatus(error, absl::StrCat("cannot stat blob sha256:", sha256_hex));
  }
  return std::make_unique<FileBlobReader>(fd, static_cast<int64_t>(st.st_size), absl::StrCat("sha256:", sha256_hex));
}

absl::StatusOr<std::string> LocalBlobStore::LocalPath(const std::string& sha256_hex) {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  std::string path = PathOf(sha256_hex);
  if (!Exists(path)) return absl::NotFoundError(absl::StrCat("no blob sha256:", sha256_hex));
  return path;
}

absl::StatusOr<std::string> LocalBlobStore::Put(absl::string_view bytes) {
  std::string hex = Sha256Hex(bytes);
  // Same digest, same bytes: nothing to write.
  if (Has(hex)) return hex;
  const std::string path = PathOf(hex);
  RECAL_RETURN_IF_ERROR(EnsureDirectory(DirectoryOf(path)));
  RECAL_RETURN_IF_ERROR(WriteFileAtomically(path, bytes));
  return hex;
}

absl::StatusOr<std::string> LocalBlobStore::AdoptFile(const std::string& path) {
  RECAL_RETURN_IF_ERROR(CheckAdoptable(path));
  RECAL_ASSIGN_OR_RETURN(std::string hex, Sha256OfFile(path));
  const std::string target = PathOf(hex);
  if (Exists(target)) {
    RECAL_RETURN_IF_ERROR(UnlinkIfPresent(path));
    return hex;
  }
  // The writer may not have fsync'ed; the blob must be durable before its name is.
  RECAL_RETURN_IF_ERROR(FsyncFile(path));
  RECAL_RETURN_IF_ERROR(EnsureDirectory(DirectoryOf(target)));
  if (::rename(path.c_str(), target.c_str()) != 0) {
    if (errno == EXDEV) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot move '", path, "' into the blob store: it is on another file system; write it under '",
          scratch_dir_, "' instead"));
    }
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot rename '", path, "' to '", target, "'"));
  }
  RECAL_RETURN_IF_ERROR(FsyncDirectory(DirectoryOf(target)));
  return hex;
}

absl::Status LocalBlobStore::Remove(const std::string& sha256_hex) {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  const std::string path = PathOf(sha256_hex);
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot remove blob '", path, "'"));
  }
  return FsyncDirectory(DirectoryOf(path));
}

absl::StatusOr<int64_t> LocalBlobStore::UploadedSize(const std::string& owner, const std::string& sha256_hex) const {
  return uploads_.UploadedSize(owner, sha256_hex);
}

absl::Status LocalBlobStore::AppendUpload(const std::string& owner, const std::string& sha256_hex, int64_t offset,
                                          absl::string_view data, int64_t expected_size) {
  return uploads_.Append(owner, sha256_hex, offset, data, expected_size);
}

absl::StatusOr<std::string> LocalBlobStore::CommitUpload(const std::string& owner, const std::string& sha256_hex,
                                                         int64_t expected_size) {
  const std::string target = PathOf(sha256_hex);
  absl::StatusOr<bool> committed = uploads_.Commit(owner, sha256_hex, expected_size, [&](const std::string& verified) {
    if (Exists(target)) return UnlinkIfPresent(verified);
    RECAL_RETURN_IF_ERROR(EnsureDirectory(DirectoryOf(target)));
    if (::rename(verified.c_str(), target.c_str()) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot rename '", verified, "' to '", target, "'"));
    }
    return FsyncDirectory(DirectoryOf(target));
  });
  if (!committed.ok()) return committed.status();
  if (*committed) return target;
  // A repeated commit (after a crash between the rename and the reply, or racing another
  // client's commit of the same bytes) succeeds.
  if (Exists(target)) return target;
  return uploads_.Incomplete(owner, sha256_hex, expected_size);
}

absl::Status LocalBlobStore::DiscardUpload(const std::string& owner, const std::string& sha256_hex) {
  return uploads_.Discard(owner, sha256_hex);
}

}  // namespace recal::store
