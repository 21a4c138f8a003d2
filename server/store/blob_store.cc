#include "server/store/blob_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/sha256.h"
#include "common/tenant_name.h"
#include "server/store/fs_util.h"
#include "common/status_macros.h"

namespace recal::store {
namespace {

using internal::DirectoryOf;
using internal::EnsureDirectory;
using internal::FsyncDirectory;
using internal::LockedFile;

// Digests come from clients and become file names, so this check is also what keeps a
// request from naming a path outside the store ("../x", "/etc/passwd", ...).
absl::Status ValidateDigest(const std::string& hex) {
  if (IsSha256Hex(hex)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("'", hex, "' is not a SHA-256 digest: expected 64 lowercase hex characters"));
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::Status WriteAll(int fd, absl::string_view data, int64_t offset, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write to '", path, "'"));
    }
    data.remove_prefix(static_cast<size_t>(n));
    offset += n;
  }
  return absl::OkStatus();
}

absl::Status FsyncFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open '", path, "' to fsync it"));
  absl::Status status;
  if (::fsync(fd) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync '", path, "'"));
  }
  ::close(fd);
  return status;
}

absl::Status UnlinkIfPresent(const std::string& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
  return absl::ErrnoToStatus(errno, absl::StrCat("cannot remove '", path, "'"));
}

}  // namespace

BlobStore::BlobStore(std::string dir) : dir_(std::move(dir)), scratch_dir_(absl::StrCat(dir_, "/tmp")) {}

absl::StatusOr<std::unique_ptr<BlobStore>> BlobStore::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("blob store directory is empty");
  std::string root = dir;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  for (const std::string& d : {root, absl::StrCat(root, "/blobs"), absl::StrCat(root, "/blobs/sha256"),
                               absl::StrCat(root, "/uploads"), absl::StrCat(root, "/tmp")}) {
    RECAL_RETURN_IF_ERROR(EnsureDirectory(d));
  }
  return std::unique_ptr<BlobStore>(new BlobStore(std::move(root)));
}

std::string BlobStore::PathOf(const std::string& sha256_hex) const {
  return absl::StrCat(dir_, "/blobs/sha256/", sha256_hex.substr(0, 2), "/", sha256_hex);
}

bool BlobStore::Has(const std::string& sha256_hex) const {
  return IsSha256Hex(sha256_hex) && Exists(PathOf(sha256_hex));
}

absl::StatusOr<int64_t> BlobStore::SizeOf(const std::string& sha256_hex) const {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  struct stat st;
  if (::stat(PathOf(sha256_hex).c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no blob sha256:", sha256_hex));
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat blob '", PathOf(sha256_hex), "'"));
  }
  return static_cast<int64_t>(st.st_size);
}

BlobReader::~BlobReader() { ::close(fd_); }

absl::Status BlobReader::ReadAt(int64_t offset, int64_t max_bytes, std::string* out) const {
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

absl::StatusOr<std::unique_ptr<BlobReader>> BlobStore::OpenReader(const std::string& sha256_hex) const {
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
  return std::unique_ptr<BlobReader>(
      new BlobReader(fd, static_cast<int64_t>(st.st_size), absl::StrCat("sha256:", sha256_hex)));
}

absl::StatusOr<std::string> BlobStore::Put(absl::string_view bytes) {
  std::string hex = Sha256Hex(bytes);
  // Same digest, same bytes: nothing to write.
  if (Has(hex)) return hex;
  const std::string path = PathOf(hex);
  RECAL_RETURN_IF_ERROR(EnsureDirectory(DirectoryOf(path)));
  RECAL_RETURN_IF_ERROR(WriteFileAtomically(path, bytes));
  return hex;
}

absl::StatusOr<std::string> BlobStore::AdoptFile(const std::string& path) {
  // Files made by a worker: a link would make a blob of a file the worker could not read.
  struct stat info;
  if (::lstat(path.c_str(), &info) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot adopt '", path, "'"));
  if (!S_ISREG(info.st_mode) || info.st_nlink != 1) {
    return absl::FailedPreconditionError(absl::StrCat("refusing to adopt '", path, "': not a plain file"));
  }
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

absl::Status BlobStore::Remove(const std::string& sha256_hex) {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  const std::string path = PathOf(sha256_hex);
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot remove blob '", path, "'"));
  }
  return FsyncDirectory(DirectoryOf(path));
}

namespace {
// Uploads in progress are kept apart per owner (tenant): one tenant neither sees nor
// disturbs another's progress on the same bytes.
std::string PartialPath(const std::string& dir, const std::string& owner, const std::string& hex) {
  return absl::StrCat(dir, "/uploads/", owner, "/", hex, ".partial");
}

absl::Status ValidateOwner(const std::string& owner) {
  if (!IsTenantName(owner)) return absl::InvalidArgumentError(absl::StrCat("'", owner, "' cannot own an upload"));
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<int64_t> BlobStore::UploadedSize(const std::string& owner, const std::string& sha256_hex) const {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  RECAL_RETURN_IF_ERROR(ValidateOwner(owner));
  const std::string path = PartialPath(dir_, owner, sha256_hex);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return 0;
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat upload '", path, "'"));
  }
  return static_cast<int64_t>(st.st_size);
}

absl::Status BlobStore::AppendUpload(const std::string& owner, const std::string& sha256_hex, int64_t offset, absl::string_view data,
                                     int64_t expected_size) {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  if (offset < 0 || expected_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("upload of sha256:", sha256_hex, ": offset (", offset,
                                                   ") and size (", expected_size, ") must be >= 0"));
  }
  RECAL_RETURN_IF_ERROR(ValidateOwner(owner));
  const std::string path = PartialPath(dir_, owner, sha256_hex);
  if (offset == 0) RECAL_RETURN_IF_ERROR(EnsureDirectory(DirectoryOf(path)));
  // The lock serialises appends (and commit/discard) of one upload, so "offset equals the
  // committed size" is checked and acted on atomically.
  RECAL_ASSIGN_OR_RETURN(LockedFile file, LockedFile::Open(path, /*create=*/true));
  RECAL_ASSIGN_OR_RETURN(const int64_t committed, file.Size());
  if (offset != committed) {
    return absl::FailedPreconditionError(absl::StrCat("upload of sha256:", sha256_hex, " has ", committed,
                                                      " bytes committed; resume at offset ", committed,
                                                      ", not ", offset));
  }
  if (static_cast<int64_t>(data.size()) > expected_size - committed) {
    return absl::InvalidArgumentError(absl::StrCat("upload of sha256:", sha256_hex, " would grow to ",
                                                   committed + static_cast<int64_t>(data.size()),
                                                   " bytes, past its declared size of ", expected_size));
  }
  if (absl::Status s = WriteAll(file.fd(), data, committed, path); !s.ok()) {
    // Keep the committed size meaningful: drop whatever part of this chunk landed.
    (void)::ftruncate(file.fd(), static_cast<off_t>(committed));
    return s;
  }
  // fdatasync covers the new size too (it is needed to read the data back).
  if (::fdatasync(file.fd()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync upload '", path, "'"));
  }
  // The first append created the file; make its directory entry durable too.
  if (committed == 0) RECAL_RETURN_IF_ERROR(FsyncDirectory(DirectoryOf(path)));
  return absl::OkStatus();
}

absl::StatusOr<std::string> BlobStore::CommitUpload(const std::string& owner, const std::string& sha256_hex) {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  RECAL_RETURN_IF_ERROR(ValidateOwner(owner));
  const std::string path = PartialPath(dir_, owner, sha256_hex);
  const std::string target = PathOf(sha256_hex);
  absl::StatusOr<LockedFile> file = LockedFile::Open(path, /*create=*/false);
  if (absl::IsNotFound(file.status())) {
    // A repeated commit (e.g. after a crash between the rename and the reply) succeeds.
    if (Exists(target)) return target;
    return absl::NotFoundError(absl::StrCat("no upload in progress for sha256:", sha256_hex));
  }
  if (!file.ok()) return file.status();
  RECAL_ASSIGN_OR_RETURN(const std::string actual, Sha256OfFile(path));
  if (actual != sha256_hex) {
    RECAL_ASSIGN_OR_RETURN(const int64_t size, file->Size());
    RECAL_RETURN_IF_ERROR(UnlinkIfPresent(path));
    return absl::InvalidArgumentError(
        absl::StrCat("upload of sha256:", sha256_hex, " is corrupt: its ", size, " bytes hash to ", actual,
                     "; the partial upload was discarded, upload again from offset 0"));
  }
  if (Exists(target)) {
    RECAL_RETURN_IF_ERROR(UnlinkIfPresent(path));
    return target;
  }
  RECAL_RETURN_IF_ERROR(EnsureDirectory(DirectoryOf(target)));
  if (::rename(path.c_str(), target.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot rename '", path, "' to '", target, "'"));
  }
  RECAL_RETURN_IF_ERROR(FsyncDirectory(DirectoryOf(target)));
  RECAL_RETURN_IF_ERROR(FsyncDirectory(DirectoryOf(path)));
  return target;
}

absl::Status BlobStore::DiscardUpload(const std::string& owner, const std::string& sha256_hex) {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  RECAL_RETURN_IF_ERROR(ValidateOwner(owner));
  const std::string path = PartialPath(dir_, owner, sha256_hex);
  absl::StatusOr<LockedFile> file = LockedFile::Open(path, /*create=*/false);
  if (absl::IsNotFound(file.status())) return absl::OkStatus();
  if (!file.ok()) return file.status();
  RECAL_RETURN_IF_ERROR(UnlinkIfPresent(path));
  return FsyncDirectory(DirectoryOf(path));
}

}  // namespace recal::store
