#include "server/engine/layer_stats.h"

#include <limits>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "server/engine/batch_moments.h"

namespace recal::engine {

void LayerStats::AddCall(int64_t n, const at::Tensor& mean, const at::Tensor& biased_var) {
  ++calls_;
  if (n < 2) ++calls_without_variance_;
  if (n < 1) return;
  at::Tensor zeros = at::zeros_like(mean);
  if (n == 1) {
    population_.Add(1, mean, zeros);
    return;
  }
  population_.Add(static_cast<double>(n), mean, biased_var * static_cast<double>(n));
  call_means_.Add(1, mean, zeros);
  call_vars_.Add(1, biased_var * (static_cast<double>(n) / static_cast<double>(n - 1)), zeros);
}

const at::Tensor& LayerStats::DeviceAccumulators(const c10::Device& device, int64_t channels) {
  if (device_accumulators_.defined()) return device_accumulators_;
  c10::InferenceMode ordinary_tensors(/*enabled=*/false);  // updated outside the forward too (Moments)
  device_accumulators_ = at::zeros({kAccumulatorRows, channels}, at::TensorOptions(device).dtype(at::kDouble));
  auto adopt = [&](Moments& moments, AccumulatorRow mean_row, AccumulatorRow m2_row) {
    at::Tensor mean = device_accumulators_[mean_row], m2 = device_accumulators_[m2_row];
    if (moments.count() > 0) {
      mean.copy_(moments.mean());
      m2.copy_(moments.m2());
    }
    moments = Moments::Over(moments.count(), mean, m2);
  };
  adopt(population_, kPopulationMean, kPopulationM2);
  adopt(call_means_, kCallMeanMean, kCallMeanM2);
  adopt(call_vars_, kCallVarMean, kCallVarM2);
  return device_accumulators_;
}

void LayerStats::CountDeviceCall(int64_t n) {
  ++calls_;
  if (n < 2) ++calls_without_variance_;
  population_.Counted(static_cast<double>(n));
  if (n >= 2) {
    call_means_.Counted(1);
    call_vars_.Counted(1);
  }
}

void LayerStats::Merge(const LayerStats& other) {
  calls_ += other.calls_;
  calls_without_variance_ += other.calls_without_variance_;
  population_.Merge(other.population_);
  call_means_.Merge(other.call_means_);
  call_vars_.Merge(other.call_vars_);
}

LayerStats LayerStats::FromParts(int64_t calls, int64_t calls_without_variance, Moments population,
                                 Moments call_means, Moments call_vars) {
  LayerStats stats;
  stats.calls_ = calls;
  stats.calls_without_variance_ = calls_without_variance;
  stats.population_ = std::move(population);
  stats.call_means_ = std::move(call_means);
  stats.call_vars_ = std::move(call_vars);
  return stats;
}

bool LayerStats::has_estimate(v1::Estimator estimator) const {
  return (estimator == v1::BATCH_AVERAGE ? call_means_ : population_).count() > 0;
}

at::Tensor LayerStats::mean(v1::Estimator estimator) const {
  return estimator == v1::BATCH_AVERAGE ? call_means_.mean() : population_.mean();
}

at::Tensor LayerStats::var(v1::Estimator estimator) const {
  return estimator == v1::BATCH_AVERAGE ? call_vars_.mean()
                                        : population_.population_variance();
}

double LayerStats::RelStdError() const { return RelStdErrorTensor().item<double>(); }

at::Tensor LayerStats::RelStdErrorTensor() const {
  const double k = call_means_.count();
  if (k < 2) {
    return at::full({}, std::numeric_limits<double>::infinity(),
                    population_.count() > 0 ? population_.mean().options()
                                            : at::TensorOptions(at::kDouble));
  }
  const at::Tensor var = population_.population_variance();
  const at::Tensor se_mean = (call_means_.sample_variance() / k).sqrt();
  const at::Tensor se_var = (call_vars_.sample_variance() / k).sqrt();
  const at::Tensor rel = at::maximum(se_mean / var.sqrt(), se_var / var);
  // Zero-variance channels have no relative error to speak of.
  return at::where(var > 0, rel, at::zeros_like(rel)).max();
}

}  // namespace recal::engine
