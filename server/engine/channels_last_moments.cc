#include "server/engine/channels_last_moments.h"

#include <algorithm>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

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

// Adds, for positions [begin, end) of `x` (positions x `stride` channels, row-major) and
// channels [0, channels) of each, each value's deviation from `pivot` and its square to `sum`
// and `squares`. It is most of the cost of a channels-last BatchNorm: compiled for AVX2 too
// (4 doubles a step), picked at load time.
__attribute__((target_clones("avx2", "default")))
void AccumulateRows(const float* __restrict x, int64_t stride, int64_t channels, int64_t begin,
                    int64_t end, const double* __restrict pivot, double* __restrict sum,
                    double* __restrict squares) {
  for (int64_t r = begin; r < end; ++r) {
    const float* __restrict row = x + r * stride;
    for (int64_t c = 0; c < channels; ++c) {
      const double d = static_cast<double>(row[c]) - pivot[c];
      sum[c] += d;
      squares[c] += d * d;
    }
  }
}

}  // namespace

std::pair<at::Tensor, at::Tensor> ChannelsLastMoments(const at::Tensor& input) {
  const int64_t channels = input.size(1);
  const int64_t positions = input.numel() / channels;
  // In channels-last memory every position holds its channels side by side.
  const float* x = input.data_ptr<float>();
  // Deviations from one observed value per channel keep the sums small: with float64
  // accumulators, Σd² - (Σd)²/n then loses nothing measurable, even where |mean| / std is 1e4.
  std::vector<double> pivot(x, x + channels);
  const int64_t blocks = std::clamp<int64_t>(positions / kMinPositionsPerBlock, 1, kMaxBlocks);
  const int64_t threads = at::get_num_threads();
  const int64_t slices =
      blocks >= threads ? 1 : std::clamp<int64_t>(channels / kMinChannelsPerSlice, 1, threads);
  std::vector<double> sums(2 * blocks * channels, 0.0);  // per block: sums, then squares
  at::parallel_for(0, blocks * slices, 1, [&](int64_t first, int64_t last) {
    for (int64_t task = first; task < last; ++task) {
      const int64_t b = task / slices, k = task % slices;
      const int64_t c0 = channels * k / slices, c1 = channels * (k + 1) / slices;
      double* sum = sums.data() + 2 * b * channels + c0;
      AccumulateRows(x + c0, channels, c1 - c0, positions * b / blocks, positions * (b + 1) / blocks,
                     pivot.data() + c0, sum, sum + channels);
    }
  });
  at::Tensor mean = at::empty({channels}, at::kDouble);
  at::Tensor var = at::empty({channels}, at::kDouble);
  double* m = mean.data_ptr<double>();
  double* v = var.data_ptr<double>();
  const double n = static_cast<double>(positions);
  for (int64_t c = 0; c < channels; ++c) {
    double sum = 0, squares = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      sum += sums[2 * b * channels + c];
      squares += sums[(2 * b + 1) * channels + c];
    }
    const double shift = sum / n;
    m[c] = pivot[c] + shift;
    const double variance = squares / n - shift * shift;
    v[c] = variance < 0 ? 0 : variance;  // rounding, never below; NaN stays NaN
  }
  return {mean, var};
}

}  // namespace recal::engine
