// The CUDA devices this process's LibTorch sees. recal-worker prints the count for
// recal-server (--print_cuda_devices), which loads no LibTorch and decides its workers'
// devices from it (server/jobs/devices.h).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace recal::engine {

// 0 where LibTorch has no CUDA (a CPU build, no driver, no device). INTERNAL if LibTorch
// fails to tell.
absl::StatusOr<int> CudaDeviceCount();

// Why CUDA sees no device, in the NVIDIA driver's own words: whether libcuda.so.1 is loaded
// and what its cuInit answers (e.g. CUDA_ERROR_NO_DEVICE, or CUDA_ERROR_OPERATING_SYSTEM
// where a sandbox refused the driver something). LibTorch's count hides the driver's error.
std::string CudaDriverStatus();

}  // namespace recal::engine
