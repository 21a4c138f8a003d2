// Client-supplied paths are served only from under the configured data roots.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recal::data {

// The canonical path of `path` (absolute, or relative to a root, tried in order) if it lies
// under one of `roots` after resolving "..", symbolic links and the like; PERMISSION_DENIED
// otherwise (also when no roots are configured), NOT_FOUND if it does not exist.
// Roots and paths may also be s3://BUCKET/PREFIX locations (s3_paths.h): an s3:// path is
// returned as it is if it parses and lies under an s3:// root (CheckS3UnderRoots), without
// asking the endpoint whether it exists; local paths are resolved under local roots only.
absl::StatusOr<std::string> ResolveUnderRoots(const std::vector<std::string>& roots,
                                              const std::string& path);

}  // namespace recal::data
