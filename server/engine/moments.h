// Per-channel count, mean and sum of squared deviations (M2) in float64, mergeable exactly.
#pragma once

#include <ATen/core/Tensor.h>

namespace recal::engine {

// Combining two sets of samples uses Chan, Golub & LeVeque's pairwise update
//   mean = mean_a + d * n_b / n,   M2 = M2_a + M2_b + d^2 * n_a * n_b / n,   d = mean_b - mean_a,
// which has no cancellation (unlike E[x^2] - E[x]^2) and gives the same result, up to
// rounding, for any split of the data and any order of merging.
class Moments {
 public:
  Moments() = default;

  // Moments whose accumulators are `mean` and `m2` (float64 [C], views of a larger tensor
  // where a kernel merges in place: batch_moments.h), holding `count` samples already.
  // Every later Add and Merge updates them in place.
  static Moments Over(double count, at::Tensor mean, at::Tensor m2);
  // A kernel has merged `count` samples into mean() and m2() in place.
  void Counted(double count) { count_ += count; }

  // Adds `count` samples per channel whose mean is `mean` and whose M2 is `m2`
  // (float64 tensors of shape [C]). A single value is Add(1, value, zeros).
  void Add(double count, const at::Tensor& mean, const at::Tensor& m2);
  void Merge(const Moments& other);

  double count() const { return count_; }
  const at::Tensor& mean() const { return mean_; }  // undefined while count() == 0
  const at::Tensor& m2() const { return m2_; }
  at::Tensor population_variance() const;  // M2 / n
  at::Tensor sample_variance() const;      // M2 / (n - 1)

 private:
  double count_ = 0;
  at::Tensor mean_;
  at::Tensor m2_;
};

}  // namespace recal::engine
