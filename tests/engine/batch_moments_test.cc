// The shared arithmetic of a BatchNorm call's statistics (server/engine/batch_moments.h):
// the CPU twin against float64 references on every input class the GPU kernel must get
// right (layouts, dtypes, ill-conditioned channels, one value per channel, NaN and Inf, many
// values), its merge against the engine's Moments, and, where a GPU and the CUDA kernel are
// here, the kernel against the twin.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/engine/batch_moments.h"
#include "server/engine/layer_stats.h"

namespace recal::engine {
namespace {

struct Merged {
  at::Tensor accumulators, mean, invstd, nonfinite;
};

// The op over `calls`, one after another, with the counts the host keeps.
Merged MergeAll(const std::vector<at::Tensor>& calls, double eps = 1e-5) {
  const at::Tensor& first = calls.front();
  const int64_t channels = first.size(1);
  const auto options = at::TensorOptions().device(first.device());
  Merged out{at::zeros({kAccumulatorRows, channels}, options.dtype(at::kDouble)),
             at::empty({channels}, options.dtype(first.scalar_type() == at::kDouble ? at::kDouble : at::kFloat)),
             at::empty({channels}, options.dtype(first.scalar_type() == at::kDouble ? at::kDouble : at::kFloat)),
             at::zeros({}, options.dtype(at::kBool))};
  BatchMomentsCounts counts;
  for (const at::Tensor& x : calls) {
    MergeBatchMoments(x, out.accumulators, counts, eps, out.mean, out.invstd, out.nonfinite);
    const double n = static_cast<double>(x.numel() / channels);
    counts.population += n;
    if (n >= 2) counts.calls_with_variance += 1;
  }
  return out;
}

// Mean and biased variance per channel of the float64 values of `x`, two-pass.
std::pair<at::Tensor, at::Tensor> Reference(const at::Tensor& x) {
  at::Tensor d = x.to(at::kDouble).transpose(0, 1).reshape({x.size(1), -1});
  return {d.mean(1), d.var(1, /*unbiased=*/false)};
}

// Largest |got - want| / scale over channels.
double Worst(const at::Tensor& got, const at::Tensor& want, const at::Tensor& scale) {
  return ((got.cpu() - want) / scale).abs().max().item<double>();
}

void ExpectMatchesReference(const at::Tensor& x, double tolerance, const std::string& what) {
  SCOPED_TRACE(what);
  const Merged merged = MergeAll({x});
  auto [mean, var] = Reference(x);
  const double n = static_cast<double>(x.numel() / x.size(1));
  const at::Tensor acc = merged.accumulators.cpu();
  const at::Tensor std = var.sqrt().clamp_min(1e-300);
  EXPECT_LE(Worst(acc[kPopulationMean], mean, std), tolerance) << "mean, in units of the std";
  EXPECT_LE(Worst(acc[kPopulationM2] / n, var, var.clamp_min(1e-300)), tolerance) << "biased variance";
  // The mean normalisation uses, in its dtype (float32 unless the input is float64).
  EXPECT_LE(Worst(merged.mean.to(at::kDouble), mean, mean.abs() + std), x.scalar_type() == at::kDouble ? 1e-13 : 1e-7);
  EXPECT_FALSE(merged.nonfinite.item<bool>());
}

TEST(BatchMomentsTest, EveryLayoutMatchesTheFloat64Reference) {
  at::manual_seed(1);
  const at::Tensor images = at::randn({6, 5, 7, 9}, at::kDouble) * 3 + 2;
  ExpectMatchesReference(images, 1e-13, "NCHW");
  ExpectMatchesReference(images.contiguous(at::MemoryFormat::ChannelsLast), 1e-13, "NHWC");
  const at::Tensor video = at::randn({3, 4, 5, 6, 7}, at::kDouble);
  ExpectMatchesReference(video, 1e-13, "NCDHW");
  ExpectMatchesReference(video.contiguous(at::MemoryFormat::ChannelsLast3d), 1e-13, "NDHWC");
  ExpectMatchesReference(at::randn({50, 12}, at::kDouble), 1e-13, "[N, C]");
  ExpectMatchesReference(at::randn({12, 50}, at::kDouble).t(), 1e-13, "[N, C] transposed (positions of a channel adjacent)");
  ExpectMatchesReference(at::randn({8, 4, 20}, at::kDouble), 1e-13, "[N, C, L]");
  ExpectMatchesReference(at::randn({6, 9, 7, 5}, at::kDouble).permute({0, 3, 2, 1}), 1e-13, "no layout of the two: copied");
}

TEST(BatchMomentsTest, EveryDtypeIsReadAsItIsAndWidenedExactly) {
  at::manual_seed(2);
  const at::Tensor x = at::randn({8, 6, 5, 5});
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    const at::Tensor typed = x.to(dtype);
    ExpectMatchesReference(typed, 1e-13, std::string(c10::toString(dtype)));
    ExpectMatchesReference(typed.contiguous(at::MemoryFormat::ChannelsLast), 1e-13,
                           std::string(c10::toString(dtype)) + " channels-last");
  }
}

TEST(BatchMomentsTest, IllConditionedChannelsStayExact) {
  at::manual_seed(3);
  // The trap of an input-normalising BatchNorm: mean 100, std 0.01, in float32.
  const at::Tensor trap = at::randn({64, 3, 16, 16}) * 0.01f + 100.0f;
  ExpectMatchesReference(trap, 1e-11, "float32 at |mean| / std = 1e4");
  ExpectMatchesReference(trap.contiguous(at::MemoryFormat::ChannelsLast), 1e-11, "the same, channels-last");
  // |mean| / std = 1e7 and beyond, in float64.
  const at::Tensor far = at::randn({32, 2, 32, 32}, at::kDouble) + 1e7;
  ExpectMatchesReference(far, 1e-8, "float64 at |mean| / std = 1e7");
  ExpectMatchesReference(at::randn({32, 2, 32, 32}, at::kDouble) * 1e-3 + 1e7, 1e-5, "float64 at 1e10");
}

TEST(BatchMomentsTest, OneValuePerChannelHasNoVarianceAndNoCallSample) {
  const at::Tensor x = at::tensor({1.5, -2.0, 1e30}, at::kDouble).view({1, 3});
  const Merged merged = MergeAll({x});
  const at::Tensor acc = merged.accumulators;
  EXPECT_TRUE(acc[kPopulationMean].equal(x[0]));
  EXPECT_TRUE(acc[kPopulationM2].equal(at::zeros({3}, at::kDouble)));
  EXPECT_TRUE(acc[kCallMeanMean].equal(at::zeros({3}, at::kDouble))) << "no call sample with n = 1";
  EXPECT_FALSE(merged.nonfinite.item<bool>());
}

TEST(BatchMomentsTest, NonFiniteStatisticsSetTheFlag) {
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    at::Tensor x = at::randn({4, 3, 2, 2});
    x[2][1][0][1] = bad;
    EXPECT_TRUE(MergeAll({x}).nonfinite.item<bool>()) << bad;
    EXPECT_TRUE(MergeAll({x.contiguous(at::MemoryFormat::ChannelsLast)}).nonfinite.item<bool>()) << bad;
  }
  // Finite values whose square overflows float64's range in the sums.
  const at::Tensor huge = at::tensor({1e300, -1e300, 1e300, -1e300}, at::kDouble).view({4, 1});
  EXPECT_TRUE(MergeAll({huge}).nonfinite.item<bool>());
}

TEST(BatchMomentsTest, ManyValuesPerChannel) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({8, 2, 512, 512}) * 2.0f + 0.5f;  // 2 million values per channel
  ExpectMatchesReference(x, 1e-12, "2^21 values per channel");
  ExpectMatchesReference(x.contiguous(at::MemoryFormat::ChannelsLast), 1e-12, "the same, channels-last");
}

TEST(BatchMomentsTest, MergingCallsEqualsTheEnginesMomentsAndTheWholeData) {
  at::manual_seed(5);
  std::vector<at::Tensor> calls{at::randn({8, 4, 3, 3}, at::kDouble) + 5, at::randn({3, 4, 3, 3}, at::kDouble) * 2,
                                at::randn({1, 4, 1, 1}, at::kDouble), at::randn({5, 4, 3, 3}, at::kDouble) - 1};
  const Merged merged = MergeAll(calls);
  LayerStats stats;
  for (const at::Tensor& x : calls) {
    auto [mean, var] = Reference(x);
    stats.AddCall(x.numel() / 4, mean, var);
  }
  const at::Tensor acc = merged.accumulators;
  EXPECT_TRUE(at::allclose(acc[kPopulationMean], stats.population().mean(), 1e-14, 1e-14));
  EXPECT_TRUE(at::allclose(acc[kPopulationM2], stats.population().m2(), 1e-13, 1e-13));
  EXPECT_TRUE(at::allclose(acc[kCallMeanMean], stats.call_means().mean(), 1e-14, 1e-14));
  EXPECT_TRUE(at::allclose(acc[kCallMeanM2], stats.call_means().m2(), 1e-13, 1e-13));
  EXPECT_TRUE(at::allclose(acc[kCallVarMean], stats.call_vars().mean(), 1e-13, 1e-13));
  EXPECT_TRUE(at::allclose(acc[kCallVarM2], stats.call_vars().m2(), 1e-12, 1e-12));
  // And the population is the statistics of every value together.
  std::vector<at::Tensor> columns;
  for (const at::Tensor& x : calls) columns.push_back(x.transpose(0, 1).reshape({4, -1}));
  const at::Tensor all = at::cat(columns, 1);
  EXPECT_TRUE(at::allclose(acc[kPopulationMean], all.mean(1), 1e-14, 1e-14));
  EXPECT_TRUE(at::allclose(acc[kPopulationM2] / all.size(1), all.var(1, false), 1e-13, 1e-13));
}

TEST(BatchMomentsTest, TheNormalisationStatisticsAreTheBatchsOwn) {
  at::manual_seed(6);
  const at::Tensor x = at::randn({4, 3, 5, 5}) * 3 + 1;
  const Merged merged = MergeAll({at::randn({4, 3, 5, 5}), x}, /*eps=*/1e-3);  // the second call's
  auto [mean, var] = Reference(x);
  EXPECT_TRUE(at::allclose(merged.mean.to(at::kDouble), mean, 1e-6, 1e-6));
  EXPECT_TRUE(at::allclose(merged.invstd.to(at::kDouble), (var + 1e-3).rsqrt(), 1e-6, 1e-6));
  // Normalised with them, the output is train-mode BatchNorm's.
  const at::Tensor out = at::batch_norm(x, {}, {}, merged.mean, merged.invstd.pow(-2) - 1e-3, false, 0, 1e-3, false);
  const at::Tensor train = at::batch_norm(x, {}, {}, {}, {}, true, 0, 1e-3, false);
  EXPECT_TRUE(at::allclose(out, train, 1e-5, 1e-5));
}

TEST(BatchMomentsTest, ABatchWithoutValuesIsTheCallersToSkip) {
  const at::Tensor empty = at::empty({0, 3, 4, 4});
  EXPECT_THROW(MergeAll({empty}), c10::Error);
}

TEST(BatchMomentsTest, TheCpuTwinIsAlwaysThere) { EXPECT_TRUE(HasBatchMomentsKernel(c10::kCPU)); }

// The CUDA kernel against the twin, on every class above, where both are here.
TEST(BatchMomentsTest, TheCudaKernelAgreesWithTheTwin) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU here: the kernel is checked against the twin by scripts/gpu_check.sh";
  if (!HasBatchMomentsKernel(c10::kCUDA)) GTEST_SKIP() << "the CUDA kernels were not built (no nvcc)";
  at::manual_seed(7);
  std::vector<at::Tensor> inputs{at::randn({6, 5, 7, 9}) * 3 + 2,
                                 at::randn({64, 3, 16, 16}) * 0.01f + 100.0f,
                                 at::randn({32, 2, 32, 32}, at::kDouble) + 1e7,
                                 at::randn({50, 12}),
                                 at::randn({3, 4, 5, 6, 7}),
                                 at::randn({1, 8}),
                                 at::randn({8, 2, 512, 512})};
  for (const at::Tensor& base : inputs) {
    for (at::ScalarType dtype : {base.scalar_type(), at::kBFloat16, at::kHalf}) {
      for (bool channels_last : {false, true}) {
        at::Tensor x = base.to(dtype);
        if (channels_last && x.dim() == 4) x = x.contiguous(at::MemoryFormat::ChannelsLast);
        if (channels_last && x.dim() == 5) x = x.contiguous(at::MemoryFormat::ChannelsLast3d);
        SCOPED_TRACE(testing::Message() << x.sizes() << " " << x.scalar_type() << (channels_last ? " channels-last" : ""));
        const Merged cpu = MergeAll({x, x * 2 + 1});
        const Merged gpu = MergeAll({x.cuda(), (x * 2 + 1).cuda()});
        EXPECT_TRUE(at::allclose(gpu.accumulators.cpu(), cpu.accumulators, 1e-12, 1e-12));
        EXPECT_TRUE(at::allclose(gpu.mean.cpu(), cpu.mean, 1e-6, 1e-6));
        EXPECT_TRUE(at::allclose(gpu.invstd.cpu(), cpu.invstd, 1e-6, 1e-6));
        EXPECT_EQ(gpu.nonfinite.item<bool>(), cpu.nonfinite.item<bool>());
      }
    }
  }
}

}  // namespace
}  // namespace recal::engine
