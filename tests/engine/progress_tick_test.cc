// The progress tick (Options::progress_tick_batches): on a GPU the host reads the batches'
// non-finite flags and errors every few batches, not after each. Forced on the CPU here, it
// must compute what a tick after every batch computes (statistics, convergence points), fail
// on the first non-finite batch with the same message, report progress and judge
// target_rel_error at ticks only.
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/script.h>

#include "server/engine/recalibration.h"
#include "tests/engine/test_util.h"
#include "tests/test_util.h"

namespace recal::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::FeedFrom;
using testing::MakeBatchNorm;
using testing::ReadSafetensors;
using testing::SaveModule;

// torchvision's ResNet-18 as tests/fixtures/make_fixtures.py scripted it.
const std::string kResNet18 = std::string(RECAL_FIXTURES_DIR) + "/models/resnet18.scripted_eval.pt";

std::vector<at::Tensor> Images(int count, int64_t batch_size = 4) {
  at::manual_seed(46);
  std::vector<at::Tensor> batches;
  for (int i = 0; i < count; ++i) batches.push_back(at::randn({batch_size, 3, 32, 32}));
  return batches;
}

// `batches` with a NaN at [1, 2, 5, 7] of batch `bad`.
std::vector<at::Tensor> WithNaN(std::vector<at::Tensor> batches, int bad) {
  batches[bad] = batches[bad].clone();
  batches[bad][1][2][5][7] = std::numeric_limits<float>::quiet_NaN();
  return batches;
}

Options TickEvery(int64_t batches) {
  Options options;
  options.progress_tick_batches = batches;
  return options;
}

struct Outcome {
  absl::Status status;
  std::unique_ptr<Recalibration> run;
  std::vector<Progress> progress;
  int batches_read = 0;  // batches the run asked the data for
};

Outcome RunOn(const std::string& model, std::vector<at::Tensor> batches, const Options& options) {
  Outcome out;
  auto run = Recalibration::Create(model, options);
  if (!run.ok()) return {run.status()};
  out.run = std::move(*run);
  auto next = FeedFrom(std::move(batches));
  out.status = out.run->Run(
      [&] {
        ++out.batches_read;
        return next();
      },
      [&](const Progress& p) { out.progress.push_back(p); });
  return out;
}

std::vector<int64_t> ProgressBatches(const Outcome& outcome) {
  std::vector<int64_t> batches;
  for (const Progress& p : outcome.progress) batches.push_back(p.batches);
  return batches;
}

void ExpectSameConvergence(const v1::RunReport& got, const v1::RunReport& want) {
  ASSERT_EQ(got.convergence_size(), want.convergence_size());
  for (int i = 0; i < want.convergence_size(); ++i) {
    EXPECT_EQ(got.convergence(i).batches(), want.convergence(i).batches()) << i;
    EXPECT_EQ(got.convergence(i).samples(), want.convergence(i).samples()) << i;
    EXPECT_EQ(got.convergence(i).layers(), want.convergence(i).layers()) << i;
    EXPECT_EQ(got.convergence(i).median_rel_std_error(), want.convergence(i).median_rel_std_error()) << i;
    EXPECT_EQ(got.convergence(i).max_rel_std_error(), want.convergence(i).max_rel_std_error()) << i;
  }
}

TEST(ProgressTick, SameStatisticsAndConvergencePointsAsATickEveryBatch) {
  recal::testing::TempDir tmp;
  // 10 batches: ticks at 1, 4 and 8, and where the data ends (10), or at max_batches.
  for (const std::optional<int64_t> max_batches : {std::optional<int64_t>(), std::optional<int64_t>(10)}) {
    std::map<std::string, at::Tensor> buffers[2];
    v1::RunReport reports[2];
    for (int k : {0, 1}) {
      Options options = TickEvery(k == 0 ? 1 : 4);
      options.max_batches = max_batches;
      Outcome out = RunOn(kResNet18, Images(10), options);
      ASSERT_TRUE(out.status.ok()) << out.status;
      const std::string path = tmp.File("bn" + std::to_string(k) + ".safetensors");
      ASSERT_TRUE(out.run->WriteBatchNormBuffers(path).ok());
      buffers[k] = ReadSafetensors(path);
      reports[k] = out.run->Report();
    }
    ASSERT_EQ(buffers[1].size(), buffers[0].size());
    ASSERT_FALSE(buffers[0].empty());
    for (const auto& [key, value] : buffers[0]) EXPECT_TRUE(value.equal(buffers[1][key])) << key;
    ASSERT_EQ(reports[0].convergence_size(), 9) << "a point per batch from the second";
    ExpectSameConvergence(reports[1], reports[0]);
  }
}

// Two BatchNorm layers in sequence.
torch::jit::Module MakeTwoLayerNet(int64_t channels) {
  torch::jit::Module net("Net");
  net.register_attribute("training", c10::BoolType::get(), true);
  net.register_module("first", MakeBatchNorm(channels));
  net.register_module("second", MakeBatchNorm(channels));
  net.define(R"(
def forward(self, x):
    return self.second.forward(self.first.forward(x) * 2.0 + 1.0)
)");
  return net;
}

std::vector<at::Tensor> Rows(int count, int64_t batch_size) {
  at::manual_seed(47);
  std::vector<at::Tensor> batches;
  for (int i = 0; i < count; ++i) batches.push_back(at::randn({batch_size, 3}) * 2 + 1);
  return batches;
}

TEST(ProgressTick, ThinnedConvergenceHistoryKeepsTheSamePoints) {
  // Past 128 points the history thins itself at a batch between two ticks: the points the
  // ticks add late must be those a tick after every batch keeps.
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeTwoLayerNet(3), tmp.File("net.pt"));
  v1::RunReport reports[2];
  for (int k : {0, 1}) {
    Options options = TickEvery(k == 0 ? 1 : 5);
    options.max_batches = 300;
    Outcome out = RunOn(model, Rows(300, 8), options);
    ASSERT_TRUE(out.status.ok()) << out.status;
    reports[k] = out.run->Report();
  }
  ASSERT_GT(reports[0].convergence_size(), kConvergencePoints / 2);
  ExpectSameConvergence(reports[1], reports[0]);
}

TEST(ProgressTick, NonFiniteBatchBetweenTicksIsNamedWithItsLayer) {
  // Ticks after batches 0 and 3 (numbered from 0): the NaN of batch 2 is read at the second,
  // when batch 2 has gone.
  Outcome out = RunOn(kResNet18, WithNaN(Images(8), 2), TickEvery(4));
  ASSERT_FALSE(out.status.ok());
  EXPECT_EQ(out.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status.message()),
              HasSubstr("the batch statistics of BatchNorm layer 'bn1' in batch 2 are not finite"));
  EXPECT_THAT(std::string(out.status.message()), HasSubstr("found by the check after batch 3"));
  EXPECT_THAT(std::string(out.status.message()), HasSubstr("batch 2's inputs were no longer held"));
  EXPECT_EQ(out.batches_read, 4) << "the job fails at the tick, not at the end of the data";
  EXPECT_THAT(ProgressBatches(out), ElementsAre(1)) << "no progress for the batches after the NaN";
}

TEST(ProgressTick, NonFiniteBatchThatTicksIsLocated) {
  // Batch 3 ticks (the 4th); batch 5 is the last of the data and ticks where the data ends;
  // batch 0 is the first, which always ticks.
  for (int bad : {3, 5, 0}) {
    Outcome out = RunOn(kResNet18, WithNaN(Images(6), bad), TickEvery(4));
    ASSERT_FALSE(out.status.ok()) << bad;
    EXPECT_THAT(std::string(out.status.message()), HasSubstr("BatchNorm layer 'bn1' holds NaN at [1, "));
    EXPECT_THAT(std::string(out.status.message()), HasSubstr("in batch " + std::to_string(bad) + " ("));
    EXPECT_THAT(std::string(out.status.message()), Not(HasSubstr("no longer held")));
  }
}

TEST(ProgressTick, FeedLeavesTheCheckToTheTickAndTickMakesIt) {
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeTwoLayerNet(3), tmp.File("net.pt"));
  auto run = Recalibration::Create(model, TickEvery(4));
  ASSERT_TRUE(run.ok()) << run.status();
  std::vector<at::Tensor> batches = Rows(3, 8);
  batches[1][4][1] = std::numeric_limits<float>::quiet_NaN();
  for (const at::Tensor& batch : batches) EXPECT_TRUE((*run)->Feed({batch}).ok());
  const absl::Status ticked = (*run)->Tick();
  EXPECT_THAT(std::string(ticked.message()), HasSubstr("BatchNorm layer 'first' in batch 1 are not finite"));
  EXPECT_TRUE((*run)->Tick().ok()) << "read once";
}

TEST(ProgressTick, ProgressComesAtTicksWithTheErrorOfItsBatch) {
  Outcome every = RunOn(kResNet18, Images(10), TickEvery(1));
  ASSERT_TRUE(every.status.ok()) << every.status;
  EXPECT_THAT(ProgressBatches(every), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9, 10));
  Outcome out = RunOn(kResNet18, Images(10), TickEvery(4));
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_THAT(ProgressBatches(out), ElementsAre(1, 4, 8, 10));
  for (const Progress& p : out.progress) {
    const Progress& same = every.progress[p.batches - 1];
    EXPECT_EQ(p.samples, same.samples);
    EXPECT_EQ(p.max_batches, same.max_batches);
    EXPECT_EQ(p.rel_std_error, same.rel_std_error) << "after batch " << p.batches;
  }
  EXPECT_EQ(out.progress.back().rel_std_error, out.run->RelStdError());
}

TEST(ProgressTick, TargetPrecisionIsJudgedAtTicks) {
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeTwoLayerNet(3), tmp.File("net.pt"));
  const std::vector<at::Tensor> data = Rows(120, 64);
  constexpr double kTarget = 0.03;
  // The worst layer's error after each batch, from a run without a target.
  Outcome whole = RunOn(model, data, TickEvery(1));
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  const auto stop_at = [&](int64_t every) -> int64_t {
    for (const Progress& p : whole.progress) {
      const bool ticks = p.batches == 1 || p.batches % every == 0;
      if (ticks && p.batches >= Options().min_batches_for_target && p.rel_std_error <= kTarget) return p.batches;
    }
    return -1;
  };
  const int64_t each_batch = stop_at(1);
  ASSERT_GT(each_batch, Options().min_batches_for_target) << "the data reaches the target, not at once";
  int64_t every = 2;
  while (each_batch % every == 0) ++every;  // a tick interval that does not tick there
  const int64_t at_tick = stop_at(every);
  ASSERT_GT(at_tick, each_batch);

  for (const auto& [interval, expected] : {std::pair{int64_t{1}, each_batch}, std::pair{every, at_tick}}) {
    Options options = TickEvery(interval);
    options.target_rel_error = kTarget;
    Outcome out = RunOn(model, data, options);
    ASSERT_TRUE(out.status.ok()) << out.status;
    EXPECT_EQ(out.run->batches(), expected) << "every " << interval;
    EXPECT_TRUE(out.run->Report().stopped_early());
    EXPECT_LE(out.run->RelStdError(), kTarget);
  }
}

TEST(ProgressTick, NegativeIntervalIsRefused) {
  auto run = Recalibration::Create(kResNet18, TickEvery(-1));
  ASSERT_FALSE(run.ok());
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("progress_tick_batches"));
}

}  // namespace
}  // namespace recal::engine
