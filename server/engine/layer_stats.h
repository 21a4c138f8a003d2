// Everything accumulated for one BatchNorm layer, and the estimates made from it.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "recal/v1/report.pb.h"
#include "server/engine/moments.h"

namespace recal::engine {

class LayerStats {
 public:
  // One execution of the layer: n elements per channel (numel / C), with that call's
  // float64 mean and biased (population) variance per channel. n = 1 counts exactly
  // (variance 0) for the population; n = 0 adds nothing (mean and variance may be undefined).
  // A call with n < 2 has no unbiased variance, so batch_average leaves it out entirely.
  void AddCall(int64_t n, const at::Tensor& mean, const at::Tensor& biased_var);
  // Exact for any split of the calls between two accumulators.
  void Merge(const LayerStats& other);

  // The accumulators a kernel merges calls into on `device` (batch_moments.h: float64
  // [kAccumulatorRows, channels]), made at the first call and kept: from then on the
  // Moments below are views of its rows, whatever adds to them. What the calls merged so
  // far hold is copied in when they are made.
  const at::Tensor& DeviceAccumulators(const c10::Device& device, int64_t channels);
  // After a kernel merged a call of n >= 1 values per channel into DeviceAccumulators().
  void CountDeviceCall(int64_t n);

  // The accumulators as they are, and back (a shard's statistics travel between processes).
  static LayerStats FromParts(int64_t calls, int64_t calls_without_variance, Moments population,
                              Moments call_means, Moments call_vars);
  const Moments& population() const { return population_; }
  const Moments& call_means() const { return call_means_; }
  const Moments& call_vars() const { return call_vars_; }

  int64_t calls() const { return calls_; }
  int64_t samples() const { return static_cast<int64_t>(population_.count()); }
  // Calls that saw fewer than two values per channel, left out of batch_average.
  int64_t calls_without_variance() const { return calls_without_variance_; }

  // Whether `estimator` has new statistics (else the layer keeps its stored ones).
  bool has_estimate(v1::Estimator estimator) const;
  // The new running statistics (float64, [C]); only when has_estimate(estimator).
  at::Tensor mean(v1::Estimator estimator) const;
  at::Tensor var(v1::Estimator estimator) const;

  // Largest standard error over channels, relative to the channel's std (for the mean) or
  // variance (for the variance), from the spread of per-call statistics of the calls with
  // a variance. Infinite with fewer than two such calls. Channels with zero variance are
  // left out.
  double RelStdError() const;
  // The same as a 0-dim float64 tensor on the layer's device, without a host sync.
  at::Tensor RelStdErrorTensor() const;

 private:
  int64_t calls_ = 0;
  int64_t calls_without_variance_ = 0;
  Moments population_;  // every element counts once
  Moments call_means_;  // one value per call with n >= 2: its mean
  Moments call_vars_;   // one value per call with n >= 2: its unbiased variance
  at::Tensor device_accumulators_;  // DeviceAccumulators(), once made
};

}  // namespace recal::engine
