#include "server/engine/devices.h"

#include <ATen/Context.h>
#include <c10/core/Device.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace recal::engine {

absl::StatusOr<std::vector<std::string>> ResolveDevices(const std::string& spec, int cpu_workers) {
  std::vector<std::string> devices;
  const int cuda_devices = at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0;
  if (spec == "auto") {
    for (int i = 0; i < cuda_devices; ++i) devices.push_back(absl::StrCat("cuda:", i));
    if (!devices.empty()) return devices;
  }
  if (spec == "auto" || spec == "cpu") {
    for (int i = 0; i < std::max(1, cpu_workers); ++i) devices.push_back("cpu");
    return devices;
  }
  for (absl::string_view name : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    try {
      c10::Device device{std::string(name)};
      if (device.is_cuda() && device.index() >= cuda_devices) {
        return absl::FailedPreconditionError(absl::StrCat(
            "device ", name, " requested, but this LibTorch sees ", cuda_devices, " CUDA device(s)"));
      }
      if (!device.is_cpu() && !device.is_cuda()) throw std::invalid_argument("not cpu or cuda");
      devices.push_back(device.str());
    } catch (const std::exception&) {
      return absl::InvalidArgumentError(absl::StrCat("bad device '", name, "': use cpu, auto or cuda:N"));
    }
  }
  if (devices.empty()) return absl::InvalidArgumentError("--devices names no device");
  return devices;
}

}  // namespace recal::engine
