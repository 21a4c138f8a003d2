// The CUDA kernel of recal::merge_batch_moments (batch_moments.h), as plain C++ for its
// caller (batch_moments_cuda.cc): no CUDA or ATen type crosses this header.
#pragma once

#include <cstddef>
#include <cstdint>

namespace recal::engine::cuda {

enum class InputType { kFloat, kDouble, kBFloat16, kHalf };

// One call: an input seen as [N, C, S] (AsSamplesChannelsPositions) on the device, and where
// its statistics go.
struct BatchMomentsCall {
  const void* input = nullptr;
  InputType type = InputType::kFloat;
  int64_t samples = 0, channels = 0, positions = 0;
  bool channels_innermost = false;  // else positions innermost:
  int64_t sample_stride = 0, channel_stride = 0;  // in elements
  double* accumulators = nullptr;  // [6, C]
  void* mean = nullptr;            // [C], double where stats_double, else float
  void* invstd = nullptr;
  bool stats_double = false;
  bool* nonfinite = nullptr;
  double population = 0, calls_with_variance = 0, eps = 0;
};

// How the values of each channel are split between blocks.
struct Grid {
  int64_t splits = 1;          // blocks per channel (or per group of channels)
  int64_t channel_blocks = 1;  // channels (positions innermost) or groups of 32 (channels innermost)
};

// A grid that fills `multiprocessors` several times over, or as much as the data allows.
Grid PlanGrid(const BatchMomentsCall& call, int multiprocessors);

// Device memory a call needs besides its tensors: per channel and block two float64 partial
// sums, and per channel block a counter, zero before the first call; each call leaves its
// counters at zero again, so the workspace serves every later call on the same stream.
struct Workspace {
  double* partials = nullptr;
  unsigned int* counters = nullptr;
};
size_t PartialSums(const BatchMomentsCall& call, const Grid& grid);  // doubles
size_t CounterCount(const Grid& grid);

// Launches the one kernel of the call on `stream` (a cudaStream_t). Returns the launch's
// cudaError_t (0: cudaSuccess).
int LaunchBatchMoments(const BatchMomentsCall& call, const Grid& grid, const Workspace& workspace, void* stream);

}  // namespace recal::engine::cuda
