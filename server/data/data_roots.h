// Client-supplied paths are served only from under the configured data roots.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recal::data {

// The canonical path of `path` (absolute, or relative to a root, tried in order) if it lies
// under one of `roots` after resolving "..", symbolic links and the like; PERMISSION_DENIED
// otherwise (also when no roots are configured), NOT_FOUND if it does not exist.
absl::StatusOr<std::string> ResolveUnderRoots(const std::vector<std::string>& roots,
                                              const std::string& path);

}  // namespace recal::data
