#include "server/engine/moments.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace recal::engine {

void Moments::Add(double count, const at::Tensor& mean, const at::Tensor& m2) {
  if (count <= 0) return;
  // The forward runs in inference mode, where new tensors are inference tensors, which may
  // never be updated in place outside it; but merging shards, and any later Add, happen
  // outside. Accumulators are therefore always ordinary tensors, whoever calls.
  c10::InferenceMode ordinary_tensors(/*enabled=*/false);
  if (count_ == 0) {
    count_ = count;
    if (mean_.defined()) {  // accumulators of their own (Over): filled, not replaced
      mean_.copy_(mean);
      m2_.copy_(m2);
    } else {
      mean_ = mean.to(at::kDouble, /*non_blocking=*/false, /*copy=*/true);
      m2_ = m2.to(at::kDouble, /*non_blocking=*/false, /*copy=*/true);
    }
    return;
  }
  const double total = count_ + count;
  // Shards may have run on other devices.
  at::Tensor delta = mean.to(mean_.device()) - mean_;
  mean_.add_(delta, count / total);
  m2_.add_(m2.to(m2_.device())).add_(delta.square_(), count_ * count / total);
  count_ = total;
}

Moments Moments::Over(double count, at::Tensor mean, at::Tensor m2) {
  Moments moments;
  moments.count_ = count;
  moments.mean_ = std::move(mean);
  moments.m2_ = std::move(m2);
  return moments;
}

void Moments::Merge(const Moments& other) { Add(other.count_, other.mean_, other.m2_); }

at::Tensor Moments::population_variance() const { return m2_ / count_; }

at::Tensor Moments::sample_variance() const { return m2_ / (count_ - 1); }

}  // namespace recal::engine
