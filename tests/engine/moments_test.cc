// The accumulators against direct float64 computations: exact merging for any split and
// order, uneven batches, ill-conditioned channels, and the two estimators.
#include <algorithm>
#include <random>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "server/engine/layer_stats.h"
#include "server/engine/moments.h"

namespace recal::engine {
namespace {

// [samples, channels] float64 data whose channels have very different offsets and spreads.
at::Tensor MakeData(int64_t samples, double offset_scale, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn({samples, 4}, at::kDouble);
  at::Tensor scale = at::tensor({1.0, 0.01, 100.0, 1e-3}, at::kDouble);
  at::Tensor offset = at::tensor({0.0, 1.0, -3.0, 1.0}, at::kDouble) * offset_scale;
  return x * scale + offset;
}

// Cuts [0, n) at `cuts` sorted positions.
std::vector<std::pair<int64_t, int64_t>> Pieces(int64_t n, std::vector<int64_t> cuts) {
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::pair<int64_t, int64_t>> pieces;
  int64_t begin = 0;
  for (int64_t cut : cuts) {
    if (cut > begin && cut < n) pieces.emplace_back(begin, cut);
    if (cut > begin && cut < n) begin = cut;
  }
  pieces.emplace_back(begin, n);
  return pieces;
}

Moments MomentsOf(const at::Tensor& x) {
  Moments m;
  at::Tensor mean = x.mean(0);
  m.Add(static_cast<double>(x.size(0)), mean, (x - mean).square().sum(0));
  return m;
}

void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, double rel) {
  at::Tensor tolerance = expected.abs() * rel + 1e-300;
  EXPECT_TRUE(((actual - expected).abs() <= tolerance).all().item<bool>())
      << "actual " << actual << "\nexpected " << expected;
}

TEST(Moments, AnySplitInAnyOrderGivesTheWholeDataStatistics) {
  const at::Tensor x = MakeData(1000, 1.0, 1);
  const at::Tensor mean = x.mean(0);
  const at::Tensor var = x.var(0, /*unbiased=*/false);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int64_t> cuts;
    std::uniform_int_distribution<int64_t> pos(1, 999);
    for (int i = 0, k = 1 + trial % 9; i < k; ++i) cuts.push_back(pos(rng));
    std::vector<Moments> parts;
    for (auto [b, e] : Pieces(1000, cuts)) parts.push_back(MomentsOf(x.slice(0, b, e)));
    std::shuffle(parts.begin(), parts.end(), rng);
    // Merge as a tree on even trials, left to right on odd ones.
    while (parts.size() > 1) {
      std::vector<Moments> next;
      for (size_t i = 0; i < parts.size(); i += 2) {
        if (i + 1 < parts.size()) parts[i].Merge(parts[i + 1]);
        next.push_back(parts[i]);
        if (trial % 2 == 1 && i == 0) {
          for (size_t j = 2; j < parts.size(); ++j) next.back().Merge(parts[j]);
          break;
        }
      }
      parts = next;
    }
    EXPECT_EQ(parts[0].count(), 1000);
    ExpectClose(parts[0].mean(), mean, 1e-12);
    ExpectClose(parts[0].population_variance(), var, 1e-11);
  }
}

TEST(Moments, IllConditionedChannelsKeepTheirVariance) {
  // |mean| / std up to 1e7: E[x^2] - E[x]^2 would lose most digits, even in float64.
  const at::Tensor x = MakeData(4096, 1e4, 2);
  Moments merged;
  for (int64_t b = 0; b < 4096; b += 100) merged.Merge(MomentsOf(x.slice(0, b, b + 100)));
  ExpectClose(merged.mean(), x.mean(0), 1e-14);
  ExpectClose(merged.population_variance(), x.var(0, false), 1e-9);
}

TEST(Moments, EmptyPartsChangeNothing) {
  const at::Tensor x = MakeData(10, 1.0, 3);
  Moments m = MomentsOf(x);
  m.Merge(Moments());
  Moments empty;
  empty.Merge(m);
  ExpectClose(empty.mean(), x.mean(0), 1e-15);
  EXPECT_EQ(empty.count(), 10);
}

TEST(LayerStats, PopulationWeighsSamplesAndUndoesBessel) {
  const at::Tensor x = MakeData(50, 1.0, 4);
  LayerStats stats;
  for (auto [b, e] : Pieces(50, {7, 8, 30})) {  // uneven: 7, 1... (1 is skipped below)
    at::Tensor part = x.slice(0, b, e);
    if (part.size(0) < 2) continue;
    stats.AddCall(part.size(0), part.mean(0), part.var(0, false));
  }
  const at::Tensor used = at::cat({x.slice(0, 0, 7), x.slice(0, 8, 50)});
  ExpectClose(stats.mean(v1::POPULATION), used.mean(0), 1e-13);
  ExpectClose(stats.var(v1::POPULATION), used.var(0, false), 1e-12);
  EXPECT_EQ(stats.samples(), 49);
  EXPECT_EQ(stats.calls(), 3);
}

TEST(LayerStats, BatchAverageWeighsBatchesAndAveragesUnbiasedVariances) {
  const at::Tensor x = MakeData(40, 1.0, 5);
  LayerStats stats;
  std::vector<at::Tensor> parts = {x.slice(0, 0, 4), x.slice(0, 4, 34), x.slice(0, 34, 40)};
  for (const at::Tensor& p : parts) stats.AddCall(p.size(0), p.mean(0), p.var(0, false));
  const at::Tensor mean = (parts[0].mean(0) + parts[1].mean(0) + parts[2].mean(0)) / 3;
  const at::Tensor var = (parts[0].var(0, true) + parts[1].var(0, true) + parts[2].var(0, true)) / 3;
  ExpectClose(stats.mean(v1::BATCH_AVERAGE), mean, 1e-13);
  ExpectClose(stats.var(v1::BATCH_AVERAGE), var, 1e-12);
  // ... which is not the population variance of uneven batches.
  EXPECT_FALSE(at::allclose(stats.var(v1::BATCH_AVERAGE), x.var(0, false), 1e-3));
}

TEST(LayerStats, MergingCallsSplitBetweenWorkersIsExact) {
  const at::Tensor x = MakeData(64, 10.0, 6);
  LayerStats whole, first, second;
  for (int64_t b = 0; b < 64; b += 8) {
    at::Tensor p = x.slice(0, b, b + 8);
    whole.AddCall(8, p.mean(0), p.var(0, false));
    (b < 24 ? first : second).AddCall(8, p.mean(0), p.var(0, false));
  }
  second.Merge(first);  // the other order
  for (auto estimator : {v1::POPULATION, v1::BATCH_AVERAGE}) {
    ExpectClose(second.mean(estimator), whole.mean(estimator), 1e-13);
    ExpectClose(second.var(estimator), whole.var(estimator), 1e-12);
  }
  EXPECT_NEAR(second.RelStdError(), whole.RelStdError(), 1e-12);
}

TEST(LayerStats, RelStdErrorShrinksWithMoreBatches) {
  const at::Tensor x = MakeData(6400, 1.0, 8);
  LayerStats stats;
  EXPECT_TRUE(std::isinf(stats.RelStdError()));
  double after_10 = 0;
  for (int64_t b = 0; b < 6400; b += 64) {
    at::Tensor p = x.slice(0, b, b + 64);
    stats.AddCall(64, p.mean(0), p.var(0, false));
    if (stats.calls() == 10) after_10 = stats.RelStdError();
  }
  EXPECT_LT(stats.RelStdError(), after_10 / 2);  // ~ 1/sqrt(k): 10 -> 100 calls
  EXPECT_GT(stats.RelStdError(), 0);
}

}  // namespace
}  // namespace recal::engine
