// The arithmetic of batch_moments.h that the CUDA kernel and its CPU twin share as code, not
// only as a description: a call's mean and variance from its shifted sums, and its merge
// into a layer's accumulators. Plain C++, compiled by nvcc for the device as well.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define RECAL_HOST_DEVICE __host__ __device__
#else
#define RECAL_HOST_DEVICE
#endif

namespace recal::engine::arithmetic {

// The rows of AccumulatorRow (batch_moments.h), repeated here for the device.
inline constexpr int kPopulationMean = 0, kPopulationM2 = 1, kCallMeanMean = 2, kCallMeanM2 = 3, kCallVarMean = 4,
                     kCallVarM2 = 5;

struct MeanVariance {
  double mean;
  double var;  // biased
};

// From s1 = Σ(x - K), s2 = Σ(x - K)² over n values: mean = K + s1/n, and the biased variance
// s2/n - (s1/n)², never below 0 (rounding), NaN staying NaN.
RECAL_HOST_DEVICE inline MeanVariance FromShiftedSums(double shift, double s1, double s2, double n) {
  const double offset = s1 / n;
  const double var = s2 / n - offset * offset;
  return {shift + offset, var < 0 ? 0 : var};
}

// Chan's merge of `count` values of mean `mean` and M2 `m2` into (*mean_a, *m2_a), which
// hold `count_a` values: the formula Moments::Add applies to tensors.
RECAL_HOST_DEVICE inline void Merge(double* mean_a, double* m2_a, double count_a, double mean, double m2, double count) {
  const double total = count_a + count;
  const double delta = mean - *mean_a;
  *mean_a += delta * (count / total);
  *m2_a = (*m2_a + m2) + delta * delta * (count_a * count / total);
}

// Merges channel c's call (n values per channel, statistics `call`) into `accumulators`
// ([6, channels], row-major): the population, and for n >= 2 one sample of the call means
// and of the unbiased call variances. Returns whether the call's statistics are finite.
RECAL_HOST_DEVICE inline bool MergeCall(double* accumulators, int64_t channels, int64_t c, MeanVariance call, double n,
                                        double population, double calls_with_variance) {
  auto row = [&](int r) { return accumulators + r * channels + c; };
  Merge(row(kPopulationMean), row(kPopulationM2), population, call.mean, call.var * n, n);
  if (n >= 2) {
    Merge(row(kCallMeanMean), row(kCallMeanM2), calls_with_variance, call.mean, 0, 1);
    Merge(row(kCallVarMean), row(kCallVarM2), calls_with_variance, call.var * (n / (n - 1)), 0, 1);
  }
  const double both = call.mean + call.var;
  return both - both == 0;  // false for NaN and for either infinity
}

}  // namespace recal::engine::arithmetic
