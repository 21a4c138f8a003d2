// The free-space floor of the file system that uploads are staged on (--min_free_disk_bytes):
// new upload bytes are refused where writing them would leave less free, so that one large
// upload cannot fill the disk the metadata store, the jobs' scratch and the logs share, and
// wait there until it expires. Checked before an upload begins (its remaining bytes) and
// before each chunk; concurrent uploads may each pass and together go past it by at most the
// chunks they write at once, and a write that finds the disk full anyway discards its upload
// (UploadStaging: ENOSPC).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace recal::store {

// The bytes an unprivileged writer may still use on the file system holding `path`
// (statvfs: f_bavail blocks of f_frsize).
absl::StatusOr<int64_t> FreeBytesAt(const std::string& path);

using FreeBytesFn = std::function<absl::StatusOr<int64_t>()>;

class DiskFloor {
 public:
  // The floor of `min_free_bytes` (0: none) under `dir`; `free_bytes` says what is free there
  // now (null: FreeBytesAt(dir); tests give another).
  DiskFloor(std::string dir, int64_t min_free_bytes, FreeBytesFn free_bytes = nullptr);
  DiskFloor(const DiskFloor&) = delete;  // the default FreeBytesFn reads this one's dir_
  DiskFloor& operator=(const DiskFloor&) = delete;

  // OK when writing `bytes` more leaves at least the floor free (always, with no floor);
  // RESOURCE_EXHAUSTED saying what is free, the flag and what to do (not the directory: the
  // message goes to clients).
  absl::Status Admit(int64_t bytes) const;

  const std::string& dir() const { return dir_; }
  int64_t min_free_bytes() const { return min_free_bytes_; }
  absl::StatusOr<int64_t> FreeBytes() const { return free_bytes_(); }
  // Whether what is free now is below the floor (false with no floor, or when it cannot be read).
  bool Below() const;

 private:
  const std::string dir_;
  const int64_t min_free_bytes_;
  const FreeBytesFn free_bytes_;
};

}  // namespace recal::store
