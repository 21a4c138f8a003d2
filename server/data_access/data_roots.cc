#include "server/data_access/data_roots.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/data_access/s3_paths.h"

namespace recal::data {
namespace {

namespace fs = std::filesystem;

bool IsWithin(const fs::path& path, const fs::path& root) {
  auto p = path.begin();
  for (auto r = root.begin(); r != root.end(); ++r, ++p) {
    if (r->empty()) continue;  // a trailing separator
    if (p == path.end() || *p != *r) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ResolveUnderRoots(const std::vector<std::string>& roots,
                                              const std::string& path) {
  if (roots.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("path ", path, " refused: the server has no data roots (--data_root)"));
  }
  if (path.empty()) return absl::InvalidArgumentError("empty data path");
  if (IsS3Path(path)) {
    // An object (npy:, safetensors:) or a folder prefix (images:): both are checked as a
    // prefix here; opening the source parses the path for what it must be. Whether it
    // exists is only known then (the endpoint is not called at submit).
    absl::StatusOr<S3Path> parsed = ParseS3FolderPath(path);
    if (!parsed.ok()) return parsed.status();
    if (absl::Status inside = CheckS3UnderRoots(roots, *parsed); !inside.ok()) return inside;
    return path;
  }
  bool missing_inside = false;
  for (const std::string& root : roots) {
    if (IsS3Path(root)) continue;  // only s3:// paths are under s3:// roots
    std::error_code error;
    const fs::path canonical_root = fs::canonical(root, error);
    if (error) continue;
    const fs::path candidate = fs::path(path).is_absolute() ? fs::path(path) : canonical_root / path;
    // ".." first, lexically; then symbolic links, on the resolved path.
    const fs::path lexical = fs::weakly_canonical(candidate, error);
    if (error || !IsWithin(lexical, canonical_root)) continue;
    const fs::path resolved = fs::canonical(candidate, error);
    if (error) {
      missing_inside = true;
      continue;
    }
    if (IsWithin(resolved, canonical_root)) return resolved.string();
  }
  if (missing_inside) return absl::NotFoundError(absl::StrCat("no such file or folder under the data roots: ", path));
  return absl::PermissionDeniedError(absl::StrCat(
      "path ", path, " is outside the server's data roots (", absl::StrJoin(roots, ", "), ")"));
}

}  // namespace recal::data
