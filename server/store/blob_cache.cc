#include "server/store/blob_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "server/store/fs_util.h"

namespace recal::store {
namespace {

struct Entry {
  std::string hex;
  int64_t bytes = 0;
  absl::Time used;
};

absl::Time ModifiedAt(const struct stat& st) { return absl::TimeFromTimespec(st.st_mtim); }

// The cache's entries: the files named by a digest (not the temporary files of a fetch).
absl::StatusOr<std::vector<Entry>> ListEntries(const std::string& dir) {
  DIR* listing = ::opendir(dir.c_str());
  if (listing == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("cannot list ", dir));
  std::vector<Entry> entries;
  while (const struct dirent* item = ::readdir(listing)) {
    const std::string name = item->d_name;
    if (!IsSha256Hex(name)) continue;
    struct stat st {};
    if (::fstatat(::dirfd(listing), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    entries.push_back({name, static_cast<int64_t>(st.st_size), ModifiedAt(st)});
  }
  ::closedir(listing);
  return entries;
}

}  // namespace

BlobCache::BlobCache(std::string dir, int64_t max_bytes, absl::Duration grace)
    : dir_(std::move(dir)), max_bytes_(max_bytes), grace_(grace) {}

std::string BlobCache::PathOf(const std::string& sha256_hex) const { return absl::StrCat(dir_, "/", sha256_hex); }

std::optional<std::string> BlobCache::Find(const std::string& sha256_hex) {
  std::string path = PathOf(sha256_hex);
  std::lock_guard<std::mutex> lock(mu_);
  // The use is the file's modification time: it survives a restart, and only whole, verified
  // files ever have this name, so marking one changes nothing a reader sees.
  if (::utimensat(AT_FDCWD, path.c_str(), nullptr, 0) != 0) return std::nullopt;
  return path;
}

std::shared_ptr<void> BlobCache::Hold(const std::string& sha256_hex) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++holds_[sha256_hex];
  }
  return std::shared_ptr<void>(nullptr, [this, sha256_hex](void*) { Release(sha256_hex); });
}

void BlobCache::Release(const std::string& sha256_hex) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = holds_.find(sha256_hex);
  if (it != holds_.end() && --it->second == 0) holds_.erase(it);
}

absl::StatusOr<BlobCache::Trimmed> BlobCache::Trim() {
  Trimmed trimmed;
  if (max_bytes_ <= 0) return trimmed;
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<std::vector<Entry>> entries = ListEntries(dir_);
  if (!entries.ok()) return entries.status();
  for (const Entry& entry : *entries) trimmed.kept_bytes += entry.bytes;
  std::sort(entries->begin(), entries->end(), [](const Entry& a, const Entry& b) { return a.used < b.used; });
  const absl::Time recent = absl::Now() - grace_;
  for (const Entry& entry : *entries) {
    if (trimmed.kept_bytes <= max_bytes_) break;
    if (holds_.count(entry.hex) > 0 || entry.used > recent) continue;
    if (::unlink(PathOf(entry.hex).c_str()) != 0 && errno != ENOENT) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot remove ", PathOf(entry.hex)));
    }
    ++trimmed.entries;
    trimmed.bytes += entry.bytes;
    trimmed.kept_bytes -= entry.bytes;
  }
  return trimmed;
}

absl::Status BlobCache::Remove(const std::string& sha256_hex) {
  return internal::UnlinkIfPresent(PathOf(sha256_hex));
}

}  // namespace recal::store
