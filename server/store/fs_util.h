// Small POSIX helpers for the blob store: directories that exist durably, fsync of a
// directory after a rename, and an exclusively locked file descriptor. Errors name paths.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace recal::store::internal {

std::string DirectoryOf(const std::string& path);

// Makes `dir` if missing (one level; the parent must exist) and fsyncs the parent so the new
// entry survives a crash.
absl::Status EnsureDirectory(const std::string& dir);

// fsync of a directory, so renames and unlinks in it survive a crash.
absl::Status FsyncDirectory(const std::string& dir);

// fsync of a file by path (its writer may not have made it durable).
absl::Status FsyncFile(const std::string& path);

bool Exists(const std::string& path);
absl::Status UnlinkIfPresent(const std::string& path);

// OK for a plain file with one link; FAILED_PRECONDITION otherwise. Files a worker made are
// taken into the store only so: a link would make a blob of a file the worker could not read.
absl::Status CheckAdoptable(const std::string& path);

// An open file descriptor holding flock(LOCK_EX), released and closed on destruction.
// The lock is advisory: it serialises the store's own operations on one upload, across
// threads and processes.
class LockedFile {
 public:
  // Opens `path` (creating it if `create`) and locks it. Retries if the file is unlinked
  // or replaced while waiting for the lock, so the descriptor always refers to what `path`
  // names once the lock is held. NOT_FOUND if absent and !create.
  static absl::StatusOr<LockedFile> Open(const std::string& path, bool create);

  LockedFile(LockedFile&& other) noexcept;
  LockedFile& operator=(LockedFile&& other) noexcept;
  LockedFile(const LockedFile&) = delete;
  LockedFile& operator=(const LockedFile&) = delete;
  ~LockedFile();

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  // Current size of the file (fstat).
  absl::StatusOr<int64_t> Size() const;

 private:
  LockedFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace recal::store::internal
