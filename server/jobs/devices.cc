#include "server/jobs/devices.h"

#include <algorithm>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace recal::jobs {
namespace {

struct DeviceName {
  bool cuda = false;
  int index = -1;  // -1: none given ("cpu", "cuda": the current device)
  std::string ToString() const {
    return absl::StrCat(cuda ? "cuda" : "cpu", index >= 0 ? absl::StrCat(":", index) : "");
  }
};

// A device index as c10::Device reads it: decimal digits, no sign, no leading zero.
std::optional<int> ParseIndex(absl::string_view digits) {
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return absl::ascii_isdigit(c); })) return std::nullopt;
  int index = 0;
  if (!absl::SimpleAtoi(digits, &index)) return std::nullopt;
  return index;
}

// cpu, cpu:N, cuda or cuda:N, spelled as LibTorch spells them (the workers parse the same
// names with c10::Device); nothing else is a device the workers can run on.
std::optional<DeviceName> ParseDeviceName(absl::string_view name) {
  DeviceName device;
  if (absl::ConsumePrefix(&name, "cuda")) {
    device.cuda = true;
  } else if (!absl::ConsumePrefix(&name, "cpu")) {
    return std::nullopt;
  }
  if (name.empty()) return device;
  if (!absl::ConsumePrefix(&name, ":")) return std::nullopt;
  std::optional<int> index = ParseIndex(name);
  if (!index) return std::nullopt;
  device.index = *index;
  return device;
}

absl::StatusOr<int> CountFor(const std::string& spec, const CudaDeviceCounter& count_cuda_devices) {
  absl::StatusOr<int> count = count_cuda_devices();
  if (!count.ok()) {
    return absl::Status(count.status().code(), absl::StrCat("--devices=", spec, ": cannot count the CUDA devices: ",
                                                            count.status().message()));
  }
  return count;
}

std::vector<std::string> CpuWorkers(int cpu_workers) {
  return std::vector<std::string>(static_cast<size_t>(std::max(1, cpu_workers)), "cpu");
}

// Every CUDA device, or CPU workers where there is none.
absl::StatusOr<std::vector<std::string>> AutoDevices(int cpu_workers, const CudaDeviceCounter& count_cuda_devices) {
  absl::StatusOr<int> count = CountFor("auto", count_cuda_devices);
  if (!count.ok()) return count.status();
  if (*count == 0) return CpuWorkers(cpu_workers);
  std::vector<std::string> devices;
  for (int i = 0; i < *count; ++i) devices.push_back(absl::StrCat("cuda:", i));
  return devices;
}

// A CUDA device without an index is the current one: there must be one.
absl::Status CheckCudaDevices(const std::vector<DeviceName>& names, int count) {
  for (const DeviceName& name : names) {
    if (name.cuda && std::max(name.index, 0) >= count) {
      return absl::FailedPreconditionError(absl::StrCat("device ", name.ToString(),
                                                        " requested, but recal-worker's LibTorch sees ", count,
                                                        " CUDA device(s)"));
    }
  }
  return absl::OkStatus();
}

// "cuda:0,cuda:1": every name checked before the counter is asked.
absl::StatusOr<std::vector<std::string>> NamedDevices(const std::string& spec,
                                                      const CudaDeviceCounter& count_cuda_devices) {
  std::vector<DeviceName> names;
  for (absl::string_view name : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    std::optional<DeviceName> device = ParseDeviceName(name);
    if (!device) return absl::InvalidArgumentError(absl::StrCat("bad device '", name, "': use cpu, auto or cuda:N"));
    names.push_back(*device);
  }
  if (names.empty()) return absl::InvalidArgumentError("--devices names no device");
  if (std::any_of(names.begin(), names.end(), [](const DeviceName& name) { return name.cuda; })) {
    absl::StatusOr<int> count = CountFor(spec, count_cuda_devices);
    if (!count.ok()) return count.status();
    if (absl::Status present = CheckCudaDevices(names, *count); !present.ok()) return present;
  }
  std::vector<std::string> devices;
  for (const DeviceName& name : names) devices.push_back(name.ToString());
  return devices;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveDevices(const std::string& spec, int cpu_workers,
                                                        const CudaDeviceCounter& count_cuda_devices) {
  if (spec == "cpu") return CpuWorkers(cpu_workers);
  if (spec == "auto") return AutoDevices(cpu_workers, count_cuda_devices);
  return NamedDevices(spec, count_cuda_devices);
}

}  // namespace recal::jobs
