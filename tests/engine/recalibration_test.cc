// Engine behaviour on small modules defined in C++: precision on ill-conditioned channels,
// outcomes (unused, excluded, non-finite, short data, no BatchNorm, frozen, bad archives),
// batch limits, early stopping, concurrent runs and what gets written.
#include "server/engine/recalibration.h"

#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/passes/freeze_module.h>
#include <torch/script.h>

#include "absl/strings/str_cat.h"
#include "server/engine/devices.h"
#include "server/engine/graph_rewrite.h"
#include "tests/engine/test_util.h"
#include "tests/test_util.h"

namespace recal::engine {
namespace {

using ::testing::HasSubstr;
using testing::FeedFrom;
using testing::MakeBatchNorm;
using testing::ReadSafetensors;
using testing::SaveModule;

// Two BatchNorm layers in sequence, `first` and `second`, plus one never called.
torch::jit::Module MakeNet(int64_t channels) {
  torch::jit::Module net("Net");
  net.register_attribute("training", c10::BoolType::get(), true);
  net.register_module("first", MakeBatchNorm(channels));
  net.register_module("second", MakeBatchNorm(channels));
  net.register_module("spare", MakeBatchNorm(channels));
  net.define(R"(
def forward(self, x):
    return self.second.forward(self.first.forward(x) * 2.0 + 1.0)
)");
  return net;
}

// A 3x3 convolution (dense, or depthwise with `depthwise`) into `bn`; with
// `flatten_by_view` its output is flattened with view(), which channels-last cannot do, and
// unflattened into `bn` again (before a BatchNorm: the forward does not end before it).
torch::jit::Module MakeConvNet(int64_t channels, bool depthwise, bool flatten_by_view = false) {
  torch::jit::Module net("ConvNet");
  net.register_attribute("training", c10::BoolType::get(), true);
  net.register_attribute("groups", c10::IntType::get(), depthwise ? channels : 1);
  net.register_parameter("weight", at::randn({channels, depthwise ? 1 : channels, 3, 3}) * 0.3, false);
  net.register_module("bn", MakeBatchNorm(channels));
  net.define(std::string(R"(
def forward(self, x):
    y = self.bn.forward(torch.conv2d(x, self.weight, None, [1, 1], [1, 1], [1, 1], self.groups))
)") + (flatten_by_view ? "    return self.bn.forward(y.view(y.size(0), -1).view(y.size()))\n"
                                         : "    return y\n"));
  return net;
}

// Per-channel float64 statistics of several batches taken together.
std::pair<at::Tensor, at::Tensor> Float64Stats(const std::vector<at::Tensor>& batches) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& b : batches) flat.push_back(b.transpose(0, 1).reshape({b.size(1), -1}));
  at::Tensor all = at::cat(flat, 1).to(at::kDouble);
  return {all.mean(1), all.var(1, /*unbiased=*/false)};
}

absl::StatusOr<std::unique_ptr<Recalibration>> RunOn(const std::string& model,
                                                      std::vector<at::Tensor> batches,
                                                      Options options = {}) {
  auto run = Recalibration::Create(model, options);
  if (!run.ok()) return run.status();
  absl::Status ran = (*run)->Run(FeedFrom(std::move(batches)));
  if (!ran.ok()) return ran;
  return run;
}

void ExpectRelClose(const at::Tensor& actual, const at::Tensor& expected, double rel) {
  at::Tensor a = actual.to(at::kDouble), e = expected.to(at::kDouble);
  at::Tensor err = (a - e).abs() / e.abs().clamp_min(1e-30);
  EXPECT_LE(err.max().item<double>(), rel) << "actual " << a << "\nexpected " << e;
}

// Means are judged relative to the channel's scale, max(|mean|, std): a mean near zero has
// no meaningful relative error of its own.
void ExpectStatsClose(std::map<std::string, at::Tensor>& written, const std::string& layer,
                      const std::pair<at::Tensor, at::Tensor>& expected, double rel) {
  const auto& [mean, var] = expected;
  at::Tensor scale = at::maximum(mean.abs(), var.sqrt());
  at::Tensor mean_err = (written[layer + "running_mean"].to(at::kDouble) - mean).abs() / scale;
  EXPECT_LE(mean_err.max().item<double>(), rel) << layer << " mean " << written[layer + "running_mean"];
  ExpectRelClose(written[layer + "running_var"], var, rel);
}

TEST(Recalibration, IllConditionedChannelsMatchFloat64) {
  // |mean| / std = 1e4 in (N, C) and channels-last inputs, where LibTorch's float32 CPU
  // kernels are off by 3e-4 and 9e-2 of the variance.
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string model = SaveModule(MakeBatchNorm(6), dir + "/bn.pt");
  at::manual_seed(0);
  const at::Tensor offsets = at::tensor({1e4, -1e4, 3e3, 0.0, 1e4, 5.0});
  for (bool channels_last : {false, true}) {
    std::vector<at::Tensor> batches;
    for (int i = 0; i < 5; ++i) {
      if (channels_last) {
        batches.push_back((at::randn({16, 6, 20, 20}, at::kDouble) + offsets.view({1, 6, 1, 1}))
                              .to(at::kFloat)
                              .contiguous(at::MemoryFormat::ChannelsLast));
      } else {
        batches.push_back((at::randn({4096, 6}, at::kDouble) + offsets).to(at::kFloat));
      }
    }
    auto run = RunOn(model, batches);
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_TRUE((*run)->WriteBatchNormBuffers(dir + "/bn.safetensors").ok());
    auto written = ReadSafetensors(dir + "/bn.safetensors");
    ExpectStatsClose(written, "", Float64Stats(batches), 1e-5);
    v1::RunReport report = (*run)->Report();
    ASSERT_EQ(report.layers_size(), 1);
    EXPECT_EQ(report.layers(0).refined_calls(), 5);
  }
}

TEST(Recalibration, OrdinaryChannelsTakeTheFusedKernelsStatistics) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string model = SaveModule(MakeNet(3), dir + "/net.pt");
  at::manual_seed(1);
  std::vector<at::Tensor> batches = {at::randn({8, 3, 5, 5}), at::randn({8, 3, 5, 5}),
                                     at::randn({3, 3, 5, 5})};
  auto run = RunOn(model, batches);
  ASSERT_TRUE(run.ok()) << run.status();
  v1::RunReport report = (*run)->Report();
  for (const auto& layer : report.layers()) EXPECT_EQ(layer.refined_calls(), 0) << layer.name();
  ASSERT_TRUE((*run)->WriteBatchNormBuffers(dir + "/bn.safetensors").ok());
  auto written = ReadSafetensors(dir + "/bn.safetensors");
  ExpectStatsClose(written, "first.", Float64Stats(batches), 1e-5);  // it sees the data itself
}

TEST(Recalibration, UnusedAndExcludedLayersKeepTheirStatistics) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string model = SaveModule(MakeNet(4), dir + "/net.pt");
  Options options;
  options.exclude = "^sec";
  auto run = RunOn(model, {at::randn({10, 4}), at::randn({10, 4})}, options);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE((*run)->WriteModel(dir + "/out.pt").ok());
  torch::jit::Module out = torch::jit::load(dir + "/out.pt");
  for (const char* kept : {"second", "spare"}) {
    torch::jit::Module bn = out.attr(kept).toModule();
    EXPECT_TRUE(bn.attr("running_mean").toTensor().equal(torch::full({4}, 0.5))) << kept;
    EXPECT_TRUE(bn.attr("running_var").toTensor().equal(torch::full({4}, 2.0))) << kept;
  }
  EXPECT_FALSE(out.attr("first").toModule().attr("running_var").toTensor().equal(
      torch::full({4}, 2.0)));
  v1::RunReport report = (*run)->Report();
  EXPECT_THAT(report.unused_layers(), ::testing::ElementsAre("spare"));
  EXPECT_EQ(report.layers_recalibrated(), 1);
  for (const auto& layer : report.layers()) {
    EXPECT_EQ(layer.excluded(), layer.name() == "second") << layer.name();
  }
}

TEST(Recalibration, WrittenModelLoadsAndCallsNoRecalOperator) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string model = SaveModule(MakeNet(2), dir + "/net.pt");
  auto run = RunOn(model, {at::randn({6, 2, 3})});
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE((*run)->WriteModel(dir + "/out.pt").ok());
  torch::jit::Module out = torch::jit::load(dir + "/out.pt");
  EXPECT_THAT(RecalOpsIn(out), ::testing::IsEmpty());
  out.eval();
  EXPECT_EQ(out.forward({at::randn({6, 2, 3})}).toTensor().sizes(), at::IntArrayRef({6, 2, 3}));
}

TEST(Recalibration, ModelWrittenIsTheSameWhetherItsCopyWasLoadedBesideTheRunOrAfterIt) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string model = SaveModule(MakeNet(3), dir + "/net.pt");
  const std::vector<at::Tensor> batches = {at::randn({8, 3}), at::randn({8, 3})};
  std::vector<std::string> written;
  for (bool preload : {true, false}) {
    Options options;
    options.preload_output_copy = preload;
    auto run = RunOn(model, batches, options);
    ASSERT_TRUE(run.ok()) << run.status();
    const std::string out = absl::StrCat(dir, "/out_", preload, ".pt");
    ASSERT_TRUE((*run)->WriteModel(out).ok());
    written.push_back(recal::testing::ReadBytes(out));
  }
  EXPECT_FALSE(written[0].empty());
  EXPECT_EQ(written[0], written[1]);
  // The file was written beside the reload check; nothing but the models is left behind.
  EXPECT_THAT(tmp.List(), ::testing::ElementsAre("net.pt", "out_0.pt", "out_1.pt"));
}

TEST(Recalibration, NonFiniteActivationsNameTheLayerAndBatch) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string model = SaveModule(MakeNet(3), dir + "/net.pt");
  at::Tensor bad = at::randn({4, 3});
  bad[2][1] = std::numeric_limits<float>::quiet_NaN();
  auto run = RunOn(model, {at::randn({4, 3}), at::randn({4, 3}), bad});
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(run.status().message(), HasSubstr("BatchNorm layer 'first' holds NaN at [2, 1] in batch 2"));
}

TEST(Recalibration, LayersSeeingOneValuePerChannelCountExactly) {
  // A last batch of one sample: BatchNorm on (N, C) sees n = 1. Eager PyTorch refuses it
  // in train mode; the population statistics count it as one more sample.
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeNet(3), tmp.path() + "/net.pt");
  const std::vector<at::Tensor> batches = {at::randn({4, 3}) * 3 + 1, at::randn({4, 3}),
                                           at::randn({1, 3}) + 5};
  for (v1::Estimator estimator : {v1::POPULATION, v1::BATCH_AVERAGE}) {
    Options options;
    options.estimator = estimator;
    auto run = RunOn(model, batches, options);
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_TRUE((*run)->WriteBatchNormBuffers(tmp.path() + "/bn.safetensors").ok());
    auto written = ReadSafetensors(tmp.path() + "/bn.safetensors");
    if (estimator == v1::POPULATION) {
      ExpectStatsClose(written, "first.", Float64Stats(batches), 1e-6);
    } else {  // the mean of the first two batches' means and unbiased variances
      at::Tensor a = batches[0].to(at::kDouble), b = batches[1].to(at::kDouble);
      ExpectStatsClose(written, "first.",
                       {(a.mean(0) + b.mean(0)) / 2, (a.var(0) + b.var(0)) / 2}, 1e-6);
    }
    const v1::RunReport report = (*run)->Report();
    ASSERT_GE(report.layers_size(), 2);
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(report.layers(i).samples(), 9) << report.layers(i).name();
      EXPECT_EQ(report.layers(i).calls(), 3);
      EXPECT_EQ(report.layers(i).calls_without_variance(), 1);
    }
  }
}

TEST(Recalibration, BatchWithoutSamplesIsRefused) {
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeNet(3), tmp.path() + "/net.pt");
  auto run = RunOn(model, {at::randn({4, 3}), at::randn({0, 3})});
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(run.status().message(), HasSubstr("batch 1 has no samples"));
}

TEST(Recalibration, StatisticsBeyondFloat32AreRefusedNotSaved) {
  // Every activation is finite, but the variance (1e40) is not a float32: the float64
  // refinement measures it and the run refuses to write Inf into the model.
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeNet(3), tmp.path() + "/net.pt");
  auto run = RunOn(model, {at::randn({4, 3}) * 1e20, at::randn({4, 3}) * 1e20});
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(run.status().message(), HasSubstr("BatchNorm layer 'first'"));
  EXPECT_THAT(run.status().message(), HasSubstr("do not fit its float buffers"));
}

TEST(Recalibration, ShortDataFailsUnlessAllowed) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string model = SaveModule(MakeNet(3), dir + "/net.pt");
  Options options;
  options.max_batches = 5;
  auto run = RunOn(model, {at::randn({4, 3}), at::randn({4, 3})}, options);
  ASSERT_FALSE(run.ok());
  EXPECT_THAT(run.status().message(), HasSubstr("only 2 batches"));
  EXPECT_THAT(run.status().message(), HasSubstr("--allow_short_data"));  // the way out, by its name
  options.allow_short_data = true;
  run = RunOn(model, {at::randn({4, 3}), at::randn({4, 3})}, options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->batches(), 2);
}

TEST(Recalibration, UsesAtMost200BatchesByDefault) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string model = SaveModule(MakeNet(3), dir + "/net.pt");
  std::vector<at::Tensor> batches(250, at::randn({4, 3}));
  auto run = RunOn(model, batches);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->batches(), kDefaultMaxBatches);
}

TEST(Recalibration, StopsOnceTheTargetPrecisionIsReached) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string model = SaveModule(MakeNet(3), dir + "/net.pt");
  std::vector<at::Tensor> batches;
  for (int i = 0; i < 150; ++i) batches.push_back(at::randn({256, 3}));
  Options options;
  options.target_rel_error = 0.02;
  auto run = RunOn(model, batches, options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_GE((*run)->batches(), options.min_batches_for_target);
  EXPECT_LT((*run)->batches(), 150);
  EXPECT_LE((*run)->RelStdError(), 0.02);
  EXPECT_TRUE((*run)->Report().stopped_early());
}

TEST(Recalibration, ModelWithoutBatchNormIsRefused) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  torch::jit::Module plain("Plain");
  plain.register_attribute("training", c10::BoolType::get(), true);
  plain.define("def forward(self, x):\n    return x * 2.0\n");
  auto run = Recalibration::Create(SaveModule(plain, dir + "/plain.pt"), {});
  ASSERT_FALSE(run.ok());
  EXPECT_THAT(run.status().message(), HasSubstr("no BatchNorm"));
}

TEST(Recalibration, FrozenModelIsRefused) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  torch::jit::Module net = MakeNet(3);
  net.eval();
  torch::jit::Module frozen = torch::jit::freeze_module(net);
  auto run = Recalibration::Create(SaveModule(frozen, dir + "/frozen.pt"), {});
  ASSERT_FALSE(run.ok());
  EXPECT_THAT(run.status().message(), HasSubstr("frozen"));
}

TEST(Recalibration, CorruptAndTruncatedArchivesAreRefused) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string good = SaveModule(MakeNet(3), dir + "/net.pt");
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir + "/truncated.pt", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  std::ofstream(dir + "/garbage.pt", std::ios::binary) << std::string(4096, '\x17');
  for (const char* name : {"/truncated.pt", "/garbage.pt"}) {
    auto run = Recalibration::Create(dir + name, {});
    ASSERT_FALSE(run.ok()) << name;
    EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
    // Told from the bytes before any loader runs, naming what is accepted.
    EXPECT_THAT(run.status().message(), HasSubstr("model archive"));
    EXPECT_THAT(run.status().message(), HasSubstr("torch.export.save"));
    EXPECT_THAT(run.status().message(), ::testing::Not(HasSubstr("\n")));
  }
  auto missing = Recalibration::Create(dir + "/missing.pt", {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("no model file"));
}

TEST(Recalibration, WrongChannelCountIsAClearError) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string model = SaveModule(MakeNet(3), dir + "/net.pt");
  auto run = RunOn(model, {at::randn({4, 5})});
  ASSERT_FALSE(run.ok());
  EXPECT_THAT(run.status().message(), HasSubstr("forward failed on batch 0"));
  EXPECT_THAT(run.status().message(), ::testing::Not(HasSubstr("\n")));
}

TEST(Recalibration, DataOfAnotherFloatDtypeNamesBothAndTheConversion) {
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeNet(3), tmp.File("net.pt"));
  auto run = RunOn(model, {at::randn({4, 3}, at::kDouble)});
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(run.status().message(), HasSubstr("input 0 is float64 but the model computes in float32"));
  EXPECT_THAT(run.status().message(), HasSubstr("x.astype(np.float32)"));
  EXPECT_THAT(run.status().message(), HasSubstr("model.to(torch.float64)"));
  // The same model on float32 data runs: the hint is for the mismatch only.
  EXPECT_TRUE(RunOn(model, {at::randn({4, 3})}).ok());
}

TEST(Recalibration, WrongInputRankIsAClearError) {
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeNet(3), tmp.File("net.pt"));
  auto run = RunOn(model, {at::randn({3})});
  ASSERT_FALSE(run.ok());
  EXPECT_THAT(run.status().message(), HasSubstr("forward failed on batch 0"));
  EXPECT_THAT(run.status().message(), ::testing::Not(HasSubstr("\n")));
}

TEST(Recalibration, BadOptionsAreRefused) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string model = SaveModule(MakeNet(3), dir + "/net.pt");
  Options bad_regex;
  bad_regex.include = "([";
  EXPECT_THAT(Recalibration::Create(model, bad_regex).status().message(), HasSubstr("--include"));
  // One CUDA device past those LibTorch sees: refused on a machine with GPUs as without.
  const absl::StatusOr<int> gpus = CudaDeviceCount();
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  Options cuda;
  cuda.device = absl::StrCat("cuda:", *gpus);
  const absl::Status beyond = Recalibration::Create(model, cuda).status();
  EXPECT_EQ(beyond.code(), absl::StatusCode::kFailedPrecondition) << beyond;
  EXPECT_THAT(beyond.message(), HasSubstr(absl::StrCat("LibTorch sees ", *gpus, " CUDA device(s)")));
  Options nonsense;
  nonsense.device = "toaster";
  EXPECT_EQ(Recalibration::Create(model, nonsense).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Recalibration, ConcurrentRunsKeepTheirOwnStatistics) {
  recal::testing::TempDir tmp;
  const std::string dir = tmp.path();
  const std::string model = SaveModule(MakeNet(3), dir + "/net.pt");
  std::vector<std::vector<at::Tensor>> data(4);
  for (size_t j = 0; j < data.size(); ++j) {
    for (int i = 0; i < 20; ++i) data[j].push_back(at::randn({16, 3}) * static_cast<double>(j + 1) + static_cast<double>(j));
  }
  std::vector<std::map<std::string, at::Tensor>> written(data.size());
  std::vector<std::thread> threads;
  for (size_t j = 0; j < data.size(); ++j) {
    threads.emplace_back([&, j] {
      auto run = RunOn(model, data[j]);
      ASSERT_TRUE(run.ok()) << run.status();
      const std::string path = dir + "/bn" + std::to_string(j) + ".safetensors";
      ASSERT_TRUE((*run)->WriteBatchNormBuffers(path).ok());
      written[j] = ReadSafetensors(path);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t j = 0; j < data.size(); ++j) {
    ExpectStatsClose(written[j], "first.", Float64Stats(data[j]), 1e-5);
  }
}

TEST(Recalibration, ChannelsLastStatisticsAreAsPreciseAsContiguous) {
  // 131072 values per channel, |mean| / std = 3 (below the float64 refinement): LibTorch's
  // fused channels-last kernel would be off by ~1e-5 here, its contiguous one by ~1e-7.
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeNet(16), tmp.File("net.pt"));
  at::manual_seed(5);
  std::vector<at::Tensor> batches = {at::randn({32, 16, 64, 64}) * 0.5 + 1.5,
                                     at::randn({32, 16, 64, 64}) * 0.5 + 1.5};
  for (MemoryFormat format : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
    Options options;
    options.memory_format = format;
    auto run = RunOn(model, batches, options);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ((*run)->memory_format(), format);
    EXPECT_EQ((*run)->Report().layers(0).refined_calls(), 0);
    ASSERT_TRUE((*run)->WriteBatchNormBuffers(tmp.File("bn.safetensors")).ok());
    auto written = ReadSafetensors(tmp.File("bn.safetensors"));
    SCOPED_TRACE(MemoryFormatName(format));
    ExpectStatsClose(written, "first.", Float64Stats(batches), 1e-6);
  }
}

TEST(Recalibration, AutoMemoryFormatFollowsTheMeasuredRule) {
  recal::testing::TempDir tmp;
  const std::string dense = SaveModule(MakeConvNet(4, false), tmp.File("dense.pt"));
  const std::string depthwise = SaveModule(MakeConvNet(4, true), tmp.File("depthwise.pt"));
  const std::string plain = SaveModule(MakeNet(4), tmp.File("plain.pt"));
  torch::jit::Module float64_net = MakeConvNet(4, true);
  float64_net.to(at::kDouble);
  const std::string depthwise64 = SaveModule(float64_net, tmp.File("depthwise64.pt"));
  at::manual_seed(6);
  const at::Tensor small = at::randn({8, 4, 6, 6}), large = at::randn({2, 4, 112, 112});
  struct Case {
    std::string model;
    at::Tensor batch;
    MemoryFormat expected;
  };
  const Case cases[] = {
      {dense, large, MemoryFormat::kChannelsLast},       // ResNet-like at 112x112 and up
      {dense, small, MemoryFormat::kContiguous},         // ResNet-like on small images
      {depthwise, small, MemoryFormat::kChannelsLast},   // MobileNet-like at any size
      {plain, large, MemoryFormat::kContiguous},         // no 2-d convolution to speed up
      {plain, at::randn({8, 4}), MemoryFormat::kContiguous},
      {depthwise64, small.to(at::kDouble), MemoryFormat::kContiguous},  // oneDNN: float32
  };
  for (const Case& c : cases) {
    auto run = RunOn(c.model, {c.batch});
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ((*run)->memory_format(), c.expected) << c.model << " " << c.batch.sizes();
  }
}

TEST(Recalibration, AutoFallsBackToContiguousForModelsThatViewActivations) {
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeConvNet(4, /*depthwise=*/true, /*flatten_by_view=*/true),
                                       tmp.File("view.pt"));
  at::manual_seed(7);
  std::vector<at::Tensor> batches = {at::randn({8, 4, 6, 6}), at::randn({8, 4, 6, 6})};
  Options channels_last;
  channels_last.memory_format = MemoryFormat::kChannelsLast;
  auto refused = RunOn(model, batches, channels_last);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("forward failed on batch 0"));

  auto fallen_back = RunOn(model, batches);
  ASSERT_TRUE(fallen_back.ok()) << fallen_back.status();
  EXPECT_EQ((*fallen_back)->memory_format(), MemoryFormat::kContiguous);
  Options contiguous;
  contiguous.memory_format = MemoryFormat::kContiguous;
  auto direct = RunOn(model, batches, contiguous);
  ASSERT_TRUE(direct.ok()) << direct.status();
  // The failed channels-last attempt left nothing behind: same calls, same statistics.
  v1::RunReport a = (*fallen_back)->Report(), b = (*direct)->Report();
  EXPECT_EQ(a.layers(0).calls_per_forward(), 2.0);
  EXPECT_EQ(a.layers(0).samples(), b.layers(0).samples());
  ASSERT_TRUE((*fallen_back)->WriteBatchNormBuffers(tmp.File("a.safetensors")).ok());
  ASSERT_TRUE((*direct)->WriteBatchNormBuffers(tmp.File("b.safetensors")).ok());
  auto wa = ReadSafetensors(tmp.File("a.safetensors")), wb = ReadSafetensors(tmp.File("b.safetensors"));
  EXPECT_TRUE(wa["bn.running_mean"].equal(wb["bn.running_mean"]));
  EXPECT_TRUE(wa["bn.running_var"].equal(wb["bn.running_var"]));
}

TEST(Recalibration, ShardsFedInInferenceModeMergeAndSave) {
  // Statistics made inside the inference-mode forward are merged, in place, outside it.
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeConvNet(4, /*depthwise=*/true), tmp.File("conv.pt"));
  at::manual_seed(8);
  std::vector<at::Tensor> first = {at::randn({8, 4, 6, 6}), at::randn({8, 4, 6, 6})};
  std::vector<at::Tensor> second = {at::randn({8, 4, 6, 6}) + 1, at::randn({5, 4, 6, 6})};
  auto a = Recalibration::Create(model, {});
  auto b = Recalibration::Create(model, {});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->RunShard(FeedFrom(first)).ok());
  ASSERT_TRUE((*b)->RunShard(FeedFrom(second)).ok());
  ASSERT_TRUE((*a)->Merge((*b)->Statistics()).ok());
  ASSERT_TRUE((*b)->Merge((*a)->Statistics()).ok());  // both ways: either may be shard 0
  ASSERT_TRUE((*a)->Finish().ok());
  ASSERT_TRUE((*a)->WriteModel(tmp.File("out.pt")).ok());
  EXPECT_EQ((*a)->Report().samples(), 29);

  auto whole = Recalibration::Create(model, {});
  ASSERT_TRUE(whole.ok());
  std::vector<at::Tensor> all = first;
  all.insert(all.end(), second.begin(), second.end());
  ASSERT_TRUE((*whole)->Run(FeedFrom(all)).ok());
  ASSERT_TRUE((*a)->WriteBatchNormBuffers(tmp.File("a.safetensors")).ok());
  ASSERT_TRUE((*whole)->WriteBatchNormBuffers(tmp.File("w.safetensors")).ok());
  auto merged = ReadSafetensors(tmp.File("a.safetensors")), unsharded = ReadSafetensors(tmp.File("w.safetensors"));
  ExpectRelClose(merged["bn.running_var"], unsharded["bn.running_var"], 1e-12);
}

TEST(Recalibration, MergedReportNamesTheLayoutTheShardsRanIn) {
  // The merging run feeds no batch itself: its report takes the shards' layout.
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeConvNet(4, /*depthwise=*/false), tmp.File("conv.pt"));
  at::manual_seed(9);
  auto shard = [&](MemoryFormat format) {
    Options options;
    options.memory_format = format;
    auto run = Recalibration::Create(model, options);
    EXPECT_TRUE(run.ok()) << run.status();
    EXPECT_TRUE((*run)->RunShard(FeedFrom({at::randn({8, 4, 6, 6})})).ok());
    return (*run)->Statistics();
  };
  const ShardStatistics last1 = shard(MemoryFormat::kChannelsLast), last2 = shard(MemoryFormat::kChannelsLast),
                        plain = shard(MemoryFormat::kContiguous);
  auto merged = [&](const std::vector<const ShardStatistics*>& shards) {
    auto run = Recalibration::Create(model, {});  // kAuto, as the merge task's
    EXPECT_TRUE(run.ok()) << run.status();
    for (const ShardStatistics* s : shards) EXPECT_TRUE((*run)->Merge(*s).ok());
    EXPECT_TRUE((*run)->Finish().ok());
    return (*run)->Report().memory_format();
  };
  EXPECT_EQ(merged({&last1, &last2}), "channels_last");
  EXPECT_EQ(merged({&plain}), "contiguous");
  EXPECT_EQ(merged({&last1, &plain, &last2}), "auto") << "auto chose differently in the shards";
}

// Under reduced-precision autocast (on the CPU: bfloat16 and, since LibTorch 2.x, float16) the
// convolution runs in that precision; the BatchNorm's statistics are those of its output,
// accumulated in float64.
void ExpectForwardMeasuresWhatItComputesIn(ComputeDtype dtype, at::ScalarType type, const std::string& name) {
  recal::testing::TempDir tmp;
  at::manual_seed(12);
  torch::jit::Module net = MakeConvNet(8, /*depthwise=*/false);
  const at::Tensor weight = net.attr("weight").toTensor();
  const std::string model = SaveModule(net, tmp.File("conv.pt"));
  std::vector<at::Tensor> batches = {at::randn({8, 8, 12, 12}) + 0.5, at::randn({5, 8, 12, 12}) * 2.0};
  std::vector<at::Tensor> seen;
  for (const at::Tensor& b : batches) {
    seen.push_back(at::conv2d(b.to(type), weight.to(type), {}, 1, 1).to(at::kDouble));
  }
  Options options;
  options.memory_format = MemoryFormat::kContiguous;
  options.compute_dtype = dtype;
  auto run = RunOn(model, batches, options);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->Report().compute_dtype(), name);
  ASSERT_TRUE((*run)->WriteBatchNormBuffers(tmp.File(name + ".safetensors")).ok());
  auto reduced = ReadSafetensors(tmp.File(name + ".safetensors"));
  ExpectStatsClose(reduced, "bn.", Float64Stats(seen), 1e-6);

  // And close to the float32 forward's: bfloat16 keeps 8 significant bits, float16 11 (2^-9 or
  // 2^-12 relative rounding of each input and product; sums accumulate in float32).
  auto exact = RunOn(model, batches, {});
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ((*exact)->Report().compute_dtype(), "float32");
  ASSERT_TRUE((*exact)->WriteBatchNormBuffers(tmp.File("f32.safetensors")).ok());
  auto f32 = ReadSafetensors(tmp.File("f32.safetensors"));
  const at::Tensor f32_mean = f32["bn.running_mean"].to(at::kDouble), f32_var = f32["bn.running_var"].to(at::kDouble);
  ExpectStatsClose(reduced, "bn.", {f32_mean, f32_var}, 1e-2);
  EXPECT_FALSE(reduced["bn.running_var"].equal(f32["bn.running_var"]));  // it did run in that precision
}

TEST(Recalibration, BFloat16ForwardMeasuresTheActivationsItComputes) {
  ExpectForwardMeasuresWhatItComputesIn(ComputeDtype::kBFloat16, at::kBFloat16, "bfloat16");
}

TEST(Recalibration, Float16ForwardRunsOnTheCpuToo) {
  ExpectForwardMeasuresWhatItComputesIn(ComputeDtype::kFloat16, at::kHalf, "float16");
}

}  // namespace
}  // namespace recal::engine
