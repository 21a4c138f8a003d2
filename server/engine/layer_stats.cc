#include "server/engine/layer_stats.h"

#include <limits>

#include <ATen/ATen.h>

namespace recal::engine {

void LayerStats::AddCall(int64_t n, const at::Tensor& mean, const at::Tensor& biased_var) {
  at::Tensor zeros = at::zeros_like(mean);
  population_.Add(static_cast<double>(n), mean, biased_var * static_cast<double>(n));
  call_means_.Add(1, mean, zeros);
  // n == 1 has no unbiased variance; the layer would have failed in at::batch_norm already.
  call_vars_.Add(1, biased_var * (static_cast<double>(n) / static_cast<double>(n - 1)), zeros);
}

void LayerStats::Merge(const LayerStats& other) {
  population_.Merge(other.population_);
  call_means_.Merge(other.call_means_);
  call_vars_.Merge(other.call_vars_);
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
                    k > 0 ? population_.mean().options() : at::TensorOptions(at::kDouble));
  }
  const at::Tensor var = population_.population_variance();
  const at::Tensor se_mean = (call_means_.sample_variance() / k).sqrt();
  const at::Tensor se_var = (call_vars_.sample_variance() / k).sqrt();
  const at::Tensor rel = at::maximum(se_mean / var.sqrt(), se_var / var);
  // Zero-variance channels have no relative error to speak of.
  return at::where(var > 0, rel, at::zeros_like(rel)).max();
}

}  // namespace recal::engine
