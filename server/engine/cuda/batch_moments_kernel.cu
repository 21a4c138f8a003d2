// One kernel per BatchNorm call: reads the input once in its own dtype, sums each channel's
// values shifted by its first value in float64 (batch_moments.h), splits every channel between
// blocks so that small channel counts still fill the GPU, and lets the block that finishes a
// channel last add the partial sums (in a fixed order: the result does not depend on which
// block that is) and merge the call into the layer's accumulators with the arithmetic the CPU
// twin runs (batch_moments_arithmetic.h). No allocation, no host synchronisation.
#include "server/engine/cuda/batch_moments_kernel.h"

#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "server/engine/batch_moments_arithmetic.h"

namespace recal::engine::cuda {
namespace {

constexpr int kThreads = 256;           // positions innermost: one channel per block
constexpr int kChannelsPerBlock = 32;   // channels innermost: a warp reads 32 adjacent channels
constexpr int kRowLanes = 8;            // ... of 8 rows at a time
constexpr int64_t kMinValuesPerThread = 4;
constexpr int64_t kMaxSplits = 4096;

__device__ inline double Wide(float v) { return v; }
__device__ inline double Wide(double v) { return v; }
__device__ inline double Wide(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline double Wide(__half v) { return __half2float(v); }

struct Sums {
  double s1, s2;
};

__device__ inline Sums WarpSum(Sums v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    v.s1 += __shfl_down_sync(0xffffffffu, v.s1, offset);
    v.s2 += __shfl_down_sync(0xffffffffu, v.s2, offset);
  }
  return v;
}

// The sums of a whole block, in thread 0 (a fixed tree: the same result for the same input).
__device__ Sums BlockSum(Sums v) {
  __shared__ double s1[kThreads / 32], s2[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = WarpSum(v);
  if (lane == 0) {
    s1[warp] = v.s1;
    s2[warp] = v.s2;
  }
  __syncthreads();
  Sums total{0, 0};
  if (warp == 0) {
    total = lane < blockDim.x / 32 ? Sums{s1[lane], s2[lane]} : Sums{0, 0};
    total = WarpSum(total);
  }
  __syncthreads();
  return total;
}

// Whether this block is the last of `splits` to finish its part of `counter`'s channels;
// the last one leaves the counter at zero for the next call. After its partial sums are
// written and made visible.
__device__ bool LastToFinish(unsigned int* counter, int64_t splits) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    last = atomicAdd(counter, 1u) == static_cast<unsigned int>(splits - 1);
    if (last) *counter = 0;
  }
  __syncthreads();
  return last;
}

// The call's statistics of channel c from its per-block partial sums, merged into the
// accumulators, and what normalising by them needs. One thread per channel.
__device__ void Finish(const BatchMomentsCall& call, int64_t c, double shift, Sums sums) {
  const double n = static_cast<double>(call.samples * call.positions);
  const arithmetic::MeanVariance stats = arithmetic::FromShiftedSums(shift, sums.s1, sums.s2, n);
  const bool finite =
      arithmetic::MergeCall(call.accumulators, call.channels, c, stats, n, call.population, call.calls_with_variance);
  const double invstd = 1.0 / sqrt(stats.var + call.eps);
  if (call.stats_double) {
    static_cast<double*>(call.mean)[c] = stats.mean;
    static_cast<double*>(call.invstd)[c] = invstd;
  } else {
    static_cast<float*>(call.mean)[c] = static_cast<float>(stats.mean);
    static_cast<float*>(call.invstd)[c] = static_cast<float>(invstd);
  }
  if (!finite) *call.nonfinite = true;
}

// The partial sums of `splits` blocks for channel c, added in block order by the lanes of
// one warp (lane j adds blocks j, j + 32, ...), then across the warp: a fixed order.
__device__ Sums AddPartials(const double* partials, int64_t c, int64_t splits, int lane) {
  Sums v{0, 0};
  for (int64_t j = lane; j < splits; j += 32) {
    v.s1 += __ldcg(partials + 2 * (c * splits + j));
    v.s2 += __ldcg(partials + 2 * (c * splits + j) + 1);
  }
  return WarpSum(v);
}

// Contiguous memory: block (split, c) sums positions [begin, end) of the N·S values of
// channel c. Each thread finds its first (sample, position) by one division, then steps.
template <typename T>
__global__ void __launch_bounds__(kThreads) PositionsInnermost(BatchMomentsCall call, Workspace workspace, int64_t splits) {
  const int64_t c = blockIdx.y, split = blockIdx.x;
  const T* channel = static_cast<const T*>(call.input) + c * call.channel_stride;
  const int64_t S = call.positions, values = call.samples * S;
  const int64_t begin = values * split / splits, end = values * (split + 1) / splits;
  const double shift = Wide(channel[0]);
  Sums v{0, 0};
  int64_t i = begin + threadIdx.x;
  int64_t n = i / S, s = i % S;
  const int64_t step_n = blockDim.x / S, step_s = blockDim.x % S;
  for (; i < end; i += blockDim.x) {
    const double d = Wide(channel[n * call.sample_stride + s]) - shift;
    v.s1 += d;
    v.s2 = fma(d, d, v.s2);
    n += step_n;
    s += step_s;
    if (s >= S) {
      s -= S;
      ++n;
    }
  }
  v = BlockSum(v);
  if (threadIdx.x == 0) {
    workspace.partials[2 * (c * splits + split)] = v.s1;
    workspace.partials[2 * (c * splits + split) + 1] = v.s2;
  }
  if (!LastToFinish(workspace.counters + c, splits) || threadIdx.x >= 32) return;
  const Sums total = AddPartials(workspace.partials, c, splits, threadIdx.x);
  if (threadIdx.x == 0) Finish(call, c, shift, total);
}

// Channels-last memory, and [N, C]: rows of C values. Block (split, g) sums rows
// [begin, end) of channels 32g .. 32g + 31, a warp reading 32 adjacent channels of a row.
template <typename T>
__global__ void __launch_bounds__(kChannelsPerBlock * kRowLanes)
    ChannelsInnermost(BatchMomentsCall call, Workspace workspace, int64_t splits) {
  const int64_t C = call.channels, rows = call.samples * call.positions;
  const int64_t c = blockIdx.y * kChannelsPerBlock + threadIdx.x, split = blockIdx.x;
  const int64_t begin = rows * split / splits, end = rows * (split + 1) / splits;
  const T* x = static_cast<const T*>(call.input);
  const bool mine = c < C;
  const double shift = mine ? Wide(x[c]) : 0;
  Sums v{0, 0};
  if (mine) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      const double d = Wide(x[r * C + c]) - shift;
      v.s1 += d;
      v.s2 = fma(d, d, v.s2);
    }
  }
  // Across the row lanes, in lane order.
  __shared__ double s1[kRowLanes][kChannelsPerBlock], s2[kRowLanes][kChannelsPerBlock];
  s1[threadIdx.y][threadIdx.x] = v.s1;
  s2[threadIdx.y][threadIdx.x] = v.s2;
  __syncthreads();
  if (threadIdx.y == 0 && mine) {
    Sums total{0, 0};
    for (int lane = 0; lane < kRowLanes; ++lane) {
      total.s1 += s1[lane][threadIdx.x];
      total.s2 += s2[lane][threadIdx.x];
    }
    workspace.partials[2 * (c * splits + split)] = total.s1;
    workspace.partials[2 * (c * splits + split) + 1] = total.s2;
  }
  if (!LastToFinish(workspace.counters + blockIdx.y, splits)) return;
  // The last block: warp y adds the partials of channels 32g + y, 32g + y + 8, ...
  for (int k = threadIdx.y; k < kChannelsPerBlock; k += kRowLanes) {
    const int64_t channel = blockIdx.y * kChannelsPerBlock + k;
    if (channel >= C) break;
    const Sums total = AddPartials(workspace.partials, channel, splits, threadIdx.x);
    if (threadIdx.x == 0) Finish(call, channel, Wide(x[channel]), total);
  }
}

template <typename T>
cudaError_t Launch(const BatchMomentsCall& call, const Grid& grid, const Workspace& workspace, cudaStream_t stream) {
  const dim3 blocks(static_cast<unsigned>(grid.splits), static_cast<unsigned>(grid.channel_blocks));
  if (call.channels_innermost) {
    ChannelsInnermost<T><<<blocks, dim3(kChannelsPerBlock, kRowLanes), 0, stream>>>(call, workspace, grid.splits);
  } else {
    PositionsInnermost<T><<<blocks, kThreads, 0, stream>>>(call, workspace, grid.splits);
  }
  return cudaGetLastError();
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

Grid PlanGrid(const BatchMomentsCall& call, int multiprocessors) {
  const int64_t target = 4 * std::max(multiprocessors, 1);
  const int64_t values = call.samples * call.positions;  // per channel
  Grid grid;
  int64_t by_work;
  if (call.channels_innermost) {
    grid.channel_blocks = CeilDiv(call.channels, kChannelsPerBlock);
    by_work = CeilDiv(values, kRowLanes * kMinValuesPerThread);
  } else {
    grid.channel_blocks = call.channels;
    by_work = CeilDiv(values, kThreads * kMinValuesPerThread);
  }
  grid.splits = std::clamp<int64_t>(std::min(CeilDiv(target, grid.channel_blocks), by_work), 1, kMaxSplits);
  return grid;
}

size_t PartialSums(const BatchMomentsCall& call, const Grid& grid) {
  return static_cast<size_t>(2 * call.channels * grid.splits);
}

size_t CounterCount(const Grid& grid) { return static_cast<size_t>(grid.channel_blocks); }

int LaunchBatchMoments(const BatchMomentsCall& call, const Grid& grid, const Workspace& workspace, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (call.type) {
    case InputType::kFloat: return Launch<float>(call, grid, workspace, s);
    case InputType::kDouble: return Launch<double>(call, grid, workspace, s);
    case InputType::kBFloat16: return Launch<__nv_bfloat16>(call, grid, workspace, s);
    case InputType::kHalf: return Launch<__half>(call, grid, workspace, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace recal::engine::cuda
