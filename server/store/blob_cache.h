// Whole, verified copies of blobs kept on this host's disk for what must read a local file
// (object storage's models, which the sandboxed worker is handed as an open file), bounded in
// bytes: once the entries pass the bound, the least recently used go first.
//
// An entry is never removed while held (a job's run holds its model from the moment it asks
// for it until it ends: between the two the file may be opened again, e.g. by a merge), nor
// within `grace` of its last use (what reads an entry without holding it, an upload's
// inspection, opens it at once). So the entries may pass the bound for a while; the disk's
// free-space floor (DiskFloor) is what refuses new bytes. One process per directory: holds
// are kept in memory (a crash releases them, as it ends the runs they were for).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace recal::store {

class BlobCache {
 public:
  // `max_bytes` 0: no bound (entries leave only with Remove).
  BlobCache(std::string dir, int64_t max_bytes, absl::Duration grace = absl::Minutes(1));

  std::string PathOf(const std::string& sha256_hex) const;

  // The entry's path if it is there, marked as used now.
  std::optional<std::string> Find(const std::string& sha256_hex);

  // Keeps the entry (there or still to come) until the returned handle goes.
  std::shared_ptr<void> Hold(const std::string& sha256_hex);

  struct Trimmed {
    int64_t entries = 0;  // removed
    int64_t bytes = 0;    // removed
    int64_t kept_bytes = 0;
  };
  // Removes the least recently used entries, neither held nor used within `grace`, until the
  // entries take at most max_bytes (or none is left to remove). After an entry came in.
  absl::StatusOr<Trimmed> Trim();

  absl::Status Remove(const std::string& sha256_hex);  // OK if absent

 private:
  void Release(const std::string& sha256_hex);

  const std::string dir_;
  const int64_t max_bytes_;
  const absl::Duration grace_;
  // Serialises Trim with Find's mark and with Hold, so that nothing it is about to remove
  // becomes used or held unseen.
  std::mutex mu_;
  std::map<std::string, int> holds_;
};

}  // namespace recal::store
