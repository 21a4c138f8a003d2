#include "server/store/fs_util.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace recal::store::internal {

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status FsyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open directory '", dir, "' to fsync it"));
  }
  absl::Status status;
  if (::fsync(fd) != 0) {
    status = absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync directory '", dir, "'"));
  }
  ::close(fd);
  return status;
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

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::Status UnlinkIfPresent(const std::string& path) {
  if (::unlink(path.c_str()) == 0 || errno == ENOENT) return absl::OkStatus();
  return absl::ErrnoToStatus(errno, absl::StrCat("cannot remove '", path, "'"));
}

absl::Status CheckAdoptable(const std::string& path) {
  struct stat info;
  if (::lstat(path.c_str(), &info) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot adopt '", path, "'"));
  if (!S_ISREG(info.st_mode) || info.st_nlink != 1) {
    return absl::FailedPreconditionError(absl::StrCat("refusing to adopt '", path, "': not a plain file"));
  }
  return absl::OkStatus();
}

absl::Status EnsureDirectory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0777) == 0) return FsyncDirectory(DirectoryOf(dir));
  if (errno != EEXIST) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot create directory '", dir, "'"));
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", dir, "' exists but is not a directory; move it out of the way"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LockedFile> LockedFile::Open(const std::string& path, bool create) {
  while (true) {
    const int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0);
    const int fd = ::open(path.c_str(), flags, 0666);
    if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open '", path, "'"));
    int rc;
    do {
      rc = ::flock(fd, LOCK_EX);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat("cannot lock '", path, "'"));
    }
    // Whoever held the lock before us may have renamed or unlinked the file (commit,
    // discard); then our descriptor refers to an orphan and we must start over.
    struct stat by_fd, by_path;
    if (::fstat(fd, &by_fd) == 0 && ::stat(path.c_str(), &by_path) == 0 && by_fd.st_dev == by_path.st_dev &&
        by_fd.st_ino == by_path.st_ino) {
      return LockedFile(fd, path);
    }
    ::close(fd);
    if (!create && ::access(path.c_str(), F_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
    }
  }
}

LockedFile::LockedFile(LockedFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

LockedFile& LockedFile::operator=(LockedFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);  // closing releases the flock
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

LockedFile::~LockedFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<int64_t> LockedFile::Size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat '", path_, "'"));
  }
  return static_cast<int64_t>(st.st_size);
}

}  // namespace recal::store::internal
