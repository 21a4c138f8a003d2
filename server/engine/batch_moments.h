// One BatchNorm call's statistics, merged where they are kept, in one pass over its input:
// the arithmetic a GPU kernel (server/engine/cuda/) and its CPU twin (batch_moments.cc)
// share, behind one dispatcher operator, recal::merge_batch_moments.
//
// Per channel c the input is read once, in its own dtype, each value widened to float64 and
// shifted by the channel's first value K (x[0, c, 0, ...]): s1 = Σ(x - K), s2 = Σ(x - K)².
// Then, with n values per channel,
//   mean = K + s1/n,   var = max(0, s2/n - (s1/n)²)   (biased),   M2 = var · n.
// Shifting by a value of the data keeps s2/n near the variance itself, so nothing cancels:
// exact in float64 for |mean| / std beyond 1e7 (where E[x²] - E[x]² in float32 loses
// everything at 1e3). Partial sums over blocks share K and simply add. The call is then
// merged into a layer's float64 accumulators with Chan's formula, exactly as Moments::Add
// does (moments.h): the population (n values), and, for a call with n >= 2, one sample each
// of the call means and of the unbiased call variances.
#pragma once

#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

namespace recal::engine {

// The rows of a layer's accumulators: a float64 tensor [kAccumulatorRows, C] on its device.
enum AccumulatorRow : int64_t {
  kPopulationMean = 0,
  kPopulationM2,
  kCallMeanMean,  // of the per-call means
  kCallMeanM2,
  kCallVarMean,   // of the per-call unbiased variances
  kCallVarM2,
  kAccumulatorRows,
};

// What the merge needs besides the input: counts the host knows without asking the device.
struct BatchMomentsCounts {
  double population = 0;           // values per channel merged into the population so far
  double calls_with_variance = 0;  // calls with n >= 2 merged into the call rows so far
};

// Reads `input` ([N, C, ...], contiguous or channels-last; float32, float64, bfloat16 or
// float16; n = numel / C >= 1 values per channel) once and merges its statistics into
// `accumulators` (zeros before the first call). Leaves the batch's mean and 1/sqrt(var + eps)
// in `mean` and `invstd` ([C], float32, or float64 for a float64 input), what normalising
// by batch statistics needs, and sets `nonfinite` (a bool scalar) when this call's
// statistics are not finite (it is never cleared here). On the input's device, without a
// host synchronisation.
void MergeBatchMoments(const at::Tensor& input, const at::Tensor& accumulators, const BatchMomentsCounts& counts,
                       double eps, const at::Tensor& mean, const at::Tensor& invstd, const at::Tensor& nonfinite);

// An input as [N, C, S] (S: the positions of a sample; 1 for [N, C]) in one of the two orders
// the sums walk: channels innermost (channels-last, and [N, C]: rows of C values, the rows
// N·S apart by C), or positions innermost (contiguous: per sample and channel, S adjacent
// values). A view of the input where its memory is either, else of a contiguous copy.
struct SamplesChannelsPositions {
  at::Tensor view;
  bool channels_innermost = false;
};
SamplesChannelsPositions AsSamplesChannelsPositions(const at::Tensor& input);

// The float64 mean and biased variance per channel of a CPU `input` (any layout and dtype
// above, n >= 1), by the same shifted sums, in one pass: how the CPU path normalises a
// channels-last float32 activation, whose fused LibTorch kernel sums in float32 (collector.cc).
std::pair<at::Tensor, at::Tensor> BatchMoments(const at::Tensor& input);

// Whether MergeBatchMoments has a kernel for `device_type` in this process (the CPU twin
// always; CUDA where the kernels were built with nvcc and are linked in).
bool HasBatchMomentsKernel(c10::DeviceType device_type);

// What --version says of the GPU path's statistics: Recal's CUDA kernel, or ATen's kernels
// where this build has none.
std::string GpuStatisticsBuild();

}  // namespace recal::engine
