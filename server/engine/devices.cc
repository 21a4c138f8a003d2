#include "server/engine/devices.h"

#include <exception>

#include <ATen/Context.h>

#include "absl/strings/str_cat.h"

namespace recal::engine {

absl::StatusOr<int> CudaDeviceCount() {
  try {
    return at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("LibTorch cannot count its CUDA devices: ", e.what()));
  }
}

}  // namespace recal::engine
