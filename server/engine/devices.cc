#include "server/engine/devices.h"

#include <dlfcn.h>

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

std::string CudaDriverStatus() {
  // Only a driver already loaded (LibTorch's CUDA init, or recal-worker before its sandbox)
  // is asked: loading one here would find nothing LibTorch did not.
  void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (driver == nullptr) return "the NVIDIA driver (libcuda.so.1) is not loaded";
  using Init = int (*)(unsigned);
  using ErrorText = int (*)(int, const char**);
  const auto init = reinterpret_cast<Init>(::dlsym(driver, "cuInit"));
  const auto error_name = reinterpret_cast<ErrorText>(::dlsym(driver, "cuGetErrorName"));
  const auto error_string = reinterpret_cast<ErrorText>(::dlsym(driver, "cuGetErrorString"));
  if (init == nullptr) return "libcuda.so.1 has no cuInit";
  const int result = init(0);
  const char* name = nullptr;
  const char* text = nullptr;
  if (error_name != nullptr) error_name(result, &name);
  if (error_string != nullptr) error_string(result, &text);
  ::dlclose(driver);
  return absl::StrCat("the driver's cuInit says ", name != nullptr ? name : "error", " (", result,
                      text != nullptr ? absl::StrCat(": ", text) : "", ")");
}

}  // namespace recal::engine
