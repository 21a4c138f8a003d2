#include "server/store/disk_floor.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace recal::store {

absl::StatusOr<int64_t> FreeBytesAt(const std::string& path) {
  struct statvfs fs;
  if (::statvfs(path.c_str(), &fs) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read the free space of '", path, "'"));
  }
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
}

DiskFloor::DiskFloor(std::string dir, int64_t min_free_bytes, FreeBytesFn free_bytes)
    : dir_(std::move(dir)),
      min_free_bytes_(min_free_bytes),
      free_bytes_(free_bytes ? std::move(free_bytes) : FreeBytesFn([this] { return FreeBytesAt(dir_); })) {}

absl::Status DiskFloor::Admit(int64_t bytes) const {
  if (min_free_bytes_ <= 0) return absl::OkStatus();
  RECAL_ASSIGN_OR_RETURN(const int64_t free, free_bytes_());
  if (free - bytes >= min_free_bytes_) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the server's disk for uploads has ", free, " bytes free, and ", bytes,
      " more would leave less than the ", min_free_bytes_,
      " it keeps free (--min_free_disk_bytes): ask its operator to free space there (delete models or jobs) or "
      "lower --min_free_disk_bytes, then upload again"));
}

bool DiskFloor::Below() const {
  if (min_free_bytes_ <= 0) return false;
  const absl::StatusOr<int64_t> free = free_bytes_();
  return free.ok() && *free < min_free_bytes_;
}

}  // namespace recal::store
