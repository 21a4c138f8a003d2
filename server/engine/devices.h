// Which devices the workers get.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recal::engine {

// "cpu" -> cpu_workers x "cpu"; "auto" -> every CUDA device, or CPU workers if there is
// none; "cuda:0,cuda:1" -> those (FAILED_PRECONDITION if this LibTorch has no such device).
absl::StatusOr<std::vector<std::string>> ResolveDevices(const std::string& spec, int cpu_workers);

}  // namespace recal::engine
