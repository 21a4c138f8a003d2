// The CUDA devices this process's LibTorch sees. recal-worker prints the count for
// recal-server (--print_cuda_devices), which loads no LibTorch and decides its workers'
// devices from it (server/jobs/devices.h).
#pragma once

#include "absl/status/statusor.h"

namespace recal::engine {

// 0 where LibTorch has no CUDA (a CPU build, no driver, no device). INTERNAL if LibTorch
// fails to tell.
absl::StatusOr<int> CudaDeviceCount();

}  // namespace recal::engine
