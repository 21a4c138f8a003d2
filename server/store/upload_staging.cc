#include "server/store/upload_staging.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "common/tenant_name.h"
#include "server/store/blob_store.h"
#include "server/store/fs_util.h"

namespace recal::store {
namespace {

using internal::DirectoryOf;
using internal::EnsureDirectory;
using internal::FsyncDirectory;
using internal::LockedFile;
using internal::UnlinkIfPresent;

// 0, or the errno of the write that failed.
int WriteAll(int fd, absl::string_view data, int64_t offset) {
  while (!data.empty()) {
    const ssize_t n = ::pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data.remove_prefix(static_cast<size_t>(n));
    offset += n;
  }
  return 0;
}

// Uploads in progress are kept apart per owner (tenant): one tenant neither sees nor
// disturbs another's progress on the same bytes.
absl::Status ValidateOwner(const std::string& owner) {
  if (!IsTenantName(owner)) return absl::InvalidArgumentError(absl::StrCat("'", owner, "' cannot own an upload"));
  return absl::OkStatus();
}

constexpr absl::string_view kPartialSuffix = ".partial";

absl::Time ModifiedAt(const struct stat& st) { return absl::TimeFromTimespec(st.st_mtim); }

// Calls `each(path, stat)` for every partial file under `dir` (no error for a directory that
// does not exist yet, nor for a file removed while listing).
absl::Status ForEachPartial(const std::string& dir,
                            const std::function<absl::Status(const std::string&, const struct stat&)>& each) {
  std::error_code error;
  std::filesystem::directory_iterator it(dir, error), end;
  if (error == std::errc::no_such_file_or_directory) return absl::OkStatus();
  if (error) return absl::InternalError(absl::StrCat("cannot list '", dir, "': ", error.message()));
  for (; it != end; it.increment(error)) {
    const std::string path = it->path().string();
    if (!absl::EndsWith(path, kPartialSuffix)) continue;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    RECAL_RETURN_IF_ERROR(each(path, st));
  }
  if (error) return absl::InternalError(absl::StrCat("cannot list '", dir, "': ", error.message()));
  return absl::OkStatus();
}

// The owners that have a directory of uploads (tenant names only: nothing else is made here).
absl::StatusOr<std::vector<std::string>> Owners(const std::string& dir) {
  std::vector<std::string> owners;
  std::error_code error;
  std::filesystem::directory_iterator it(dir, error), end;
  if (error == std::errc::no_such_file_or_directory) return owners;
  if (error) return absl::InternalError(absl::StrCat("cannot list '", dir, "': ", error.message()));
  for (; it != end; it.increment(error)) {
    std::string name = it->path().filename().string();
    if (IsTenantName(name) && it->is_directory(error)) owners.push_back(std::move(name));
  }
  return owners;
}

// Removes the partial file if it is still idle once locked (an append that held the lock
// may just have touched it).
absl::StatusOr<bool> RemoveIfIdle(const std::string& path, absl::Time idle_before) {
  absl::StatusOr<LockedFile> file = LockedFile::Open(path, /*create=*/false);
  if (absl::IsNotFound(file.status())) return false;  // committed, discarded or expired meanwhile
  if (!file.ok()) return file.status();
  struct stat st;
  if (::fstat(file->fd(), &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat '", path, "'"));
  if (ModifiedAt(st) >= idle_before) return false;
  RECAL_RETURN_IF_ERROR(UnlinkIfPresent(path));
  RECAL_RETURN_IF_ERROR(FsyncDirectory(DirectoryOf(path)));
  return true;
}

// A full disk (or the user's spent disk quota) ends the upload, rather than leaving its bytes
// to hold the disk full until it expires (--upload_idle_seconds): the partial file goes, and
// the message says so.
absl::Status DiscardForWantOfSpace(const LockedFile& file, int64_t committed) {
  RECAL_RETURN_IF_ERROR(UnlinkIfPresent(file.path()));
  RECAL_RETURN_IF_ERROR(FsyncDirectory(DirectoryOf(file.path())));
  return absl::ResourceExhaustedError(absl::StrCat(
      "the server's disk is full: this upload's ", committed,
      " staged bytes were removed to free them; ask its operator to free space (or raise --min_free_disk_bytes so that uploads "
      "stop before the disk fills), then upload again from offset 0"));
}

}  // namespace

std::string UploadStaging::PartialPath(const std::string& owner, const std::string& hex) const {
  return absl::StrCat(dir_, "/", owner, "/", hex, kPartialSuffix);
}

absl::StatusOr<int64_t> UploadStaging::UploadedSize(const std::string& owner, const std::string& sha256_hex) const {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  RECAL_RETURN_IF_ERROR(ValidateOwner(owner));
  const std::string path = PartialPath(owner, sha256_hex);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return 0;
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat upload '", path, "'"));
  }
  return static_cast<int64_t>(st.st_size);
}

absl::Status UploadStaging::Append(const std::string& owner, const std::string& sha256_hex, int64_t offset,
                                   absl::string_view data, int64_t expected_size) {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  if (offset < 0 || expected_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("upload of sha256:", sha256_hex, ": offset (", offset,
                                                   ") and size (", expected_size, ") must be >= 0"));
  }
  RECAL_RETURN_IF_ERROR(ValidateOwner(owner));
  const std::string path = PartialPath(owner, sha256_hex);
  if (offset == 0) RECAL_RETURN_IF_ERROR(EnsureDirectory(DirectoryOf(path)));
  RECAL_ASSIGN_OR_RETURN(LockedFile file, LockedFile::Open(path, /*create=*/true));
  RECAL_ASSIGN_OR_RETURN(const int64_t committed, file.Size());
  if (offset > committed) {
    return absl::FailedPreconditionError(absl::StrCat("upload of sha256:", sha256_hex, " has ", committed,
                                                      " bytes committed; resume at offset ", committed,
                                                      ", not ", offset));
  }
  // Bytes below the committed size are there already, and the digest says what they are:
  // clients uploading the same bytes at once (say, every rank of a training job) send them
  // again, and only what lies past the committed size is written. Bytes that differ are
  // caught by the digest at commit, as any others.
  const int64_t already = std::min<int64_t>(committed - offset, static_cast<int64_t>(data.size()));
  data.remove_prefix(static_cast<size_t>(already));
  if (already > 0 && data.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(data.size()) > expected_size - committed) {
    return absl::InvalidArgumentError(absl::StrCat("upload of sha256:", sha256_hex, " would grow to ",
                                                   committed + static_cast<int64_t>(data.size()),
                                                   " bytes, past its declared size of ", expected_size));
  }
  int error = WriteAll(file.fd(), data, committed);
  const char* failed = "write to";
  // fdatasync covers the new size too (it is needed to read the data back); a file system
  // that allocates late reports a full disk only here.
  if (error == 0 && ::fdatasync(file.fd()) != 0) {
    error = errno;
    failed = "fsync";
  }
  if (error == ENOSPC || error == EDQUOT) return DiscardForWantOfSpace(file, committed);
  if (error != 0) {
    // Keep the committed size meaningful: drop whatever part of this chunk landed.
    (void)::ftruncate(file.fd(), static_cast<off_t>(committed));
    return absl::ErrnoToStatus(error, absl::StrCat("cannot ", failed, " upload '", path, "'"));
  }
  // The first append created the file; make its directory entry durable too.
  if (committed == 0) RECAL_RETURN_IF_ERROR(FsyncDirectory(DirectoryOf(path)));
  return absl::OkStatus();
}

absl::StatusOr<bool> UploadStaging::Commit(const std::string& owner, const std::string& sha256_hex,
                                           int64_t expected_size,
                                           const std::function<absl::Status(const std::string&)>& take) {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  RECAL_RETURN_IF_ERROR(ValidateOwner(owner));
  const std::string path = PartialPath(owner, sha256_hex);
  absl::StatusOr<LockedFile> file = LockedFile::Open(path, /*create=*/false);
  if (absl::IsNotFound(file.status())) return false;
  if (!file.ok()) return file.status();
  // A partial file of another size is not the upload the caller saw complete: another call
  // committed that one, and a client that then found nothing staged began anew (with one byte
  // or many). Calling it corrupt would discard that new upload and fail this commit.
  RECAL_ASSIGN_OR_RETURN(const int64_t staged, file->Size());
  if (staged != expected_size) return false;
  RECAL_ASSIGN_OR_RETURN(const std::string actual, Sha256OfFile(path));
  if (actual != sha256_hex) {
    RECAL_RETURN_IF_ERROR(UnlinkIfPresent(path));
    return absl::InvalidArgumentError(
        absl::StrCat("upload of sha256:", sha256_hex, " is corrupt: its ", staged, " bytes hash to ", actual,
                     "; the partial upload was discarded, upload again from offset 0"));
  }
  RECAL_RETURN_IF_ERROR(take(path));
  RECAL_RETURN_IF_ERROR(FsyncDirectory(DirectoryOf(path)));
  return true;
}

absl::Status UploadStaging::Incomplete(const std::string& owner, const std::string& sha256_hex,
                                       int64_t expected_size) const {
  RECAL_ASSIGN_OR_RETURN(const int64_t committed, UploadedSize(owner, sha256_hex));
  return absl::FailedPreconditionError(absl::StrCat("upload of sha256:", sha256_hex, " is incomplete: ", committed,
                                                    " of ", expected_size, " bytes committed; resume from ",
                                                    committed));
}

absl::Status UploadStaging::Discard(const std::string& owner, const std::string& sha256_hex) {
  RECAL_RETURN_IF_ERROR(ValidateDigest(sha256_hex));
  RECAL_RETURN_IF_ERROR(ValidateOwner(owner));
  const std::string path = PartialPath(owner, sha256_hex);
  absl::StatusOr<LockedFile> file = LockedFile::Open(path, /*create=*/false);
  if (absl::IsNotFound(file.status())) return absl::OkStatus();
  if (!file.ok()) return file.status();
  RECAL_RETURN_IF_ERROR(UnlinkIfPresent(path));
  return FsyncDirectory(DirectoryOf(path));
}

absl::StatusOr<UploadUsage> UploadStaging::UsageOf(const std::string& owner) const {
  RECAL_RETURN_IF_ERROR(ValidateOwner(owner));
  UploadUsage usage;
  RECAL_RETURN_IF_ERROR(ForEachPartial(absl::StrCat(dir_, "/", owner), [&](const std::string&, const struct stat& st) {
    ++usage.uploads;
    usage.bytes += static_cast<int64_t>(st.st_size);
    return absl::OkStatus();
  }));
  return usage;
}

absl::StatusOr<std::map<std::string, UploadUsage>> UploadStaging::UsageByOwner() const {
  std::map<std::string, UploadUsage> by_owner;
  RECAL_ASSIGN_OR_RETURN(const std::vector<std::string> owners, Owners(dir_));
  for (const std::string& owner : owners) {
    RECAL_ASSIGN_OR_RETURN(const UploadUsage usage, UsageOf(owner));
    if (usage.uploads > 0) by_owner[owner] = usage;
  }
  return by_owner;
}

absl::StatusOr<int64_t> UploadStaging::ExpireIdle(absl::Time idle_before) {
  int64_t removed = 0;
  RECAL_ASSIGN_OR_RETURN(const std::vector<std::string> owners, Owners(dir_));
  for (const std::string& owner : owners) {
    RECAL_RETURN_IF_ERROR(
        ForEachPartial(absl::StrCat(dir_, "/", owner), [&](const std::string& path, const struct stat& st) -> absl::Status {
          if (ModifiedAt(st) >= idle_before) return absl::OkStatus();
          RECAL_ASSIGN_OR_RETURN(const bool gone, RemoveIfIdle(path, idle_before));
          removed += gone ? 1 : 0;
          return absl::OkStatus();
        }));
  }
  return removed;
}

}  // namespace recal::store
