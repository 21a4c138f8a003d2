// Which devices the scheduler's workers get (--devices), decided without LibTorch:
// recal-server never loads it. The number of CUDA devices is the one recal-worker's LibTorch
// sees (CountCudaDevices, worker_runner.h), since the workers are what run on them; it is
// asked for only when the spec needs it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recal::jobs {

// The number of CUDA devices the workers see, or why it is not known.
using CudaDeviceCounter = std::function<absl::StatusOr<int>()>;

// "cpu" -> cpu_workers x "cpu" (at least one); "auto" -> every CUDA device, or CPU workers
// if there is none; "cuda:0,cuda:1" -> those (also cpu, cpu:N and cuda). `count_cuda_devices`
// is called once for "auto" or a list naming a CUDA device, never otherwise.
// INVALID_ARGUMENT for a name that is not one of those; FAILED_PRECONDITION for a CUDA
// device beyond the count; the counter's error, its code kept, saying what asked for it.
absl::StatusOr<std::vector<std::string>> ResolveDevices(const std::string& spec, int cpu_workers,
                                                        const CudaDeviceCounter& count_cuda_devices);

}  // namespace recal::jobs
