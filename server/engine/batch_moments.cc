// The CPU twin of the CUDA kernel (server/engine/cuda/batch_moments_kernel.cu): the same
// shift, sums and merge (batch_moments.h), in C++, registered for the CPU as the operator
// recal::merge_batch_moments, and the float64 moments the CPU path normalises channels-last
// activations by (collector.cc).
#include "server/engine/batch_moments.h"

#include <algorithm>
#include <string>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "server/engine/batch_moments_arithmetic.h"

namespace recal::engine {
namespace {

// Positions are summed in blocks, the blocks in order: how many depends on the shape alone,
// so that the result does not depend on the number of threads; blocks of fewer positions
// would only cost partial sums to allocate and add.
constexpr int64_t kMaxBlocks = 32;
constexpr int64_t kMinPositionsPerBlock = 1024;
// Where there are fewer blocks than threads (late layers: few positions, many channels), the
// threads split the channels too; that leaves every sum as it is.
constexpr int64_t kMinChannelsPerSlice = 32;

// A value as float64: exact for every dtype summed here.
template <typename T>
inline double Wide(T v) {
  return static_cast<double>(static_cast<float>(v));
}
template <>
inline double Wide<double>(double v) {
  return v;
}

// Adds, for rows [begin, end) of a channels-innermost `x` (rows x `stride` channels) and
// channels [0, channels), each value's deviation from `shift` and its square to `s1` and
// `s2`: most of the cost of a channels-last BatchNorm.
template <typename T>
void AccumulateRows(const T* __restrict x, int64_t stride, int64_t channels, int64_t begin, int64_t end,
                    const double* __restrict shift, double* __restrict s1, double* __restrict s2) {
  for (int64_t r = begin; r < end; ++r) {
    const T* __restrict row = x + r * stride;
    for (int64_t c = 0; c < channels; ++c) {
      const double d = Wide(row[c]) - shift[c];
      s1[c] += d;
      s2[c] += d * d;
    }
  }
}

// float32, the common case, compiled for AVX2 too (4 doubles a step), picked at load time.
__attribute__((target_clones("avx2", "default")))
void AccumulateFloatRows(const float* __restrict x, int64_t stride, int64_t channels, int64_t begin, int64_t end,
                         const double* __restrict shift, double* __restrict s1, double* __restrict s2) {
  AccumulateRows<float>(x, stride, channels, begin, end, shift, s1, s2);
}

// The same for `count` consecutive values of one channel (positions innermost).
template <typename T>
void AccumulateRun(const T* __restrict x, int64_t count, double shift, double& s1, double& s2) {
  double a = 0, b = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double d = Wide(x[i]) - shift;
    a += d;
    b += d * d;
  }
  s1 += a;
  s2 += b;
}

__attribute__((target_clones("avx2", "default")))
void AccumulateFloatRun(const float* __restrict x, int64_t count, double shift, double& s1, double& s2) {
  AccumulateRun<float>(x, count, shift, s1, s2);
}

template <typename T>
void Rows(const T* x, int64_t stride, int64_t channels, int64_t begin, int64_t end, const double* shift, double* s1,
          double* s2) {
  if constexpr (std::is_same_v<T, float>) {
    AccumulateFloatRows(x, stride, channels, begin, end, shift, s1, s2);
  } else {
    AccumulateRows<T>(x, stride, channels, begin, end, shift, s1, s2);
  }
}

template <typename T>
void Run(const T* x, int64_t count, double shift, double& s1, double& s2) {
  if constexpr (std::is_same_v<T, float>) {
    AccumulateFloatRun(x, count, shift, s1, s2);
  } else {
    AccumulateRun<T>(x, count, shift, s1, s2);
  }
}

// Per channel: the shift K (the channel's first value), s1 and s2, over [N, C, S] `x`.
struct ShiftedSums {
  std::vector<double> shift, s1, s2;
};

template <typename T>
ShiftedSums SumsChannelsInnermost(const at::Tensor& x) {
  const int64_t samples = x.size(0), channels = x.size(1), positions = x.size(2);
  const T* base = x.data_ptr<T>();
  const int64_t rows = samples * positions;  // channels-last: every (n, s) holds its channels side by side
  ShiftedSums sums{std::vector<double>(channels), std::vector<double>(channels, 0.0), std::vector<double>(channels, 0.0)};
  for (int64_t c = 0; c < channels; ++c) sums.shift[c] = Wide(base[c]);
  const int64_t blocks = std::clamp<int64_t>(rows / kMinPositionsPerBlock, 1, kMaxBlocks);
  const int64_t threads = at::get_num_threads();
  const int64_t slices = blocks >= threads ? 1 : std::clamp<int64_t>(channels / kMinChannelsPerSlice, 1, threads);
  std::vector<double> partial(2 * blocks * channels, 0.0);  // per block: s1, then s2
  at::parallel_for(0, blocks * slices, 1, [&](int64_t first, int64_t last) {
    for (int64_t task = first; task < last; ++task) {
      const int64_t b = task / slices, k = task % slices;
      const int64_t c0 = channels * k / slices, c1 = channels * (k + 1) / slices;
      double* s1 = partial.data() + 2 * b * channels + c0;
      Rows<T>(base + c0, channels, c1 - c0, rows * b / blocks, rows * (b + 1) / blocks, sums.shift.data() + c0, s1,
              s1 + channels);
    }
  });
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t c = 0; c < channels; ++c) {
      sums.s1[c] += partial[2 * b * channels + c];
      sums.s2[c] += partial[(2 * b + 1) * channels + c];
    }
  }
  return sums;
}

template <typename T>
ShiftedSums SumsPositionsInnermost(const at::Tensor& x) {
  const int64_t samples = x.size(0), channels = x.size(1), positions = x.size(2);
  const int64_t sample_stride = x.stride(0), channel_stride = x.stride(1);
  const T* base = x.data_ptr<T>();
  ShiftedSums sums{std::vector<double>(channels), std::vector<double>(channels, 0.0), std::vector<double>(channels, 0.0)};
  at::parallel_for(0, channels, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      const T* channel = base + c * channel_stride;
      const double shift = Wide(channel[0]);
      sums.shift[c] = shift;
      for (int64_t n = 0; n < samples; ++n) Run<T>(channel + n * sample_stride, positions, shift, sums.s1[c], sums.s2[c]);
    }
  });
  return sums;
}

// The shifted sums of `input` on the CPU, in the layout it has.
ShiftedSums SumsOf(const at::Tensor& input) {
  const SamplesChannelsPositions x = AsSamplesChannelsPositions(input);
  ShiftedSums sums;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.view.scalar_type(), "batch_moments", [&] {
    sums = x.channels_innermost ? SumsChannelsInnermost<scalar_t>(x.view) : SumsPositionsInnermost<scalar_t>(x.view);
  });
  return sums;
}

template <typename Stat>
void WriteNormalisation(const std::vector<double>& means, const std::vector<double>& vars, double eps,
                        const at::Tensor& mean, const at::Tensor& invstd) {
  Stat* m = mean.data_ptr<Stat>();
  Stat* inv = invstd.data_ptr<Stat>();
  for (size_t c = 0; c < means.size(); ++c) {
    m[c] = static_cast<Stat>(means[c]);
    inv[c] = static_cast<Stat>(1.0 / std::sqrt(vars[c] + eps));
  }
}

void MergeBatchMomentsCpu(const at::Tensor& input, const at::Tensor& accumulators, double population,
                          double calls_with_variance, double eps, const at::Tensor& mean, const at::Tensor& invstd,
                          const at::Tensor& nonfinite) {
  const int64_t channels = input.size(1);
  const double n = static_cast<double>(input.numel() / channels);
  TORCH_CHECK(n >= 1, "merge_batch_moments: no values per channel");
  TORCH_CHECK(accumulators.scalar_type() == at::kDouble && accumulators.is_contiguous() &&
                  accumulators.size(0) == kAccumulatorRows && accumulators.size(1) == channels,
              "merge_batch_moments: accumulators must be float64 [", kAccumulatorRows, ", ", channels, "]");
  const ShiftedSums sums = SumsOf(input);
  std::vector<double> means(channels), vars(channels);
  bool finite = true;
  for (int64_t c = 0; c < channels; ++c) {
    const arithmetic::MeanVariance call = arithmetic::FromShiftedSums(sums.shift[c], sums.s1[c], sums.s2[c], n);
    means[c] = call.mean;
    vars[c] = call.var;
    finite &= arithmetic::MergeCall(accumulators.data_ptr<double>(), channels, c, call, n, population, calls_with_variance);
  }
  if (mean.scalar_type() == at::kDouble) {
    WriteNormalisation<double>(means, vars, eps, mean, invstd);
  } else {
    WriteNormalisation<float>(means, vars, eps, mean, invstd);
  }
  if (!finite) nonfinite.fill_(true);
}

const c10::OperatorHandle& MergeOp() {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("recal::merge_batch_moments", "");
  return op;
}

}  // namespace

SamplesChannelsPositions AsSamplesChannelsPositions(const at::Tensor& input) {
  at::Tensor x = input.dim() == 2 ? input.unsqueeze(2) : input.flatten(2);
  const int64_t n = x.size(0), c = x.size(1), s = x.size(2);
  const bool channels_innermost =
      (c == 1 || x.stride(1) == 1) && (s == 1 || x.stride(2) == c) && (n == 1 || x.stride(0) == c * s);
  if (channels_innermost) return {x, true};
  if (s == 1 || x.stride(2) == 1) return {x, false};
  return {input.contiguous().flatten(2), false};
}

TORCH_LIBRARY_FRAGMENT(recal, m) {
  m.def(torch::schema("recal::merge_batch_moments(Tensor input, Tensor(a!) accumulators, float population, "
                      "float calls_with_variance, float eps, Tensor(b!) mean, Tensor(c!) invstd, "
                      "Tensor(d!) nonfinite) -> ()",
                      c10::AliasAnalysisKind::FROM_SCHEMA));
}

TORCH_LIBRARY_IMPL(recal, CPU, m) { m.impl("merge_batch_moments", TORCH_FN(MergeBatchMomentsCpu)); }

void MergeBatchMoments(const at::Tensor& input, const at::Tensor& accumulators, const BatchMomentsCounts& counts,
                       double eps, const at::Tensor& mean, const at::Tensor& invstd, const at::Tensor& nonfinite) {
  MergeOp().typed<void(const at::Tensor&, const at::Tensor&, double, double, double, const at::Tensor&,
                       const at::Tensor&, const at::Tensor&)>()
      .call(input, accumulators, counts.population, counts.calls_with_variance, eps, mean, invstd, nonfinite);
}

bool HasBatchMomentsKernel(c10::DeviceType device_type) {
  return MergeOp().hasKernelForDispatchKey(device_type == c10::kCUDA ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU);
}

std::string GpuStatisticsBuild() {
  return HasBatchMomentsKernel(c10::kCUDA)
             ? "GPU statistics: Recal's CUDA kernel (one pass over each BatchNorm input, float64)"
             : "GPU statistics: ATen's kernels (this build has no CUDA kernels: built without nvcc, or for a CPU wheel)";
}

std::pair<at::Tensor, at::Tensor> BatchMoments(const at::Tensor& input) {
  const int64_t channels = input.size(1);
  const double n = static_cast<double>(input.numel() / channels);
  const ShiftedSums sums = SumsOf(input);
  at::Tensor mean = at::empty({channels}, at::kDouble);
  at::Tensor var = at::empty({channels}, at::kDouble);
  for (int64_t c = 0; c < channels; ++c) {
    const arithmetic::MeanVariance call = arithmetic::FromShiftedSums(sums.shift[c], sums.s1[c], sums.s2[c], n);
    mean.data_ptr<double>()[c] = call.mean;
    var.data_ptr<double>()[c] = call.var;
  }
  return {mean, var};
}

}  // namespace recal::engine
