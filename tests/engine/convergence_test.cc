// The report's convergence history: bounded however long the run, evenly thinned, from the
// first batch with an estimate to the last, ending at the final error the layers report;
// none for a merge of shards.
#include "server/engine/convergence.h"

#include <algorithm>

#include <gtest/gtest.h>
#include <torch/script.h>

#include "server/engine/recalibration.h"
#include "tests/engine/test_util.h"
#include "tests/test_util.h"

namespace recal::engine {
namespace {

using testing::FeedFrom;
using testing::MakeBatchNorm;
using testing::SaveModule;

v1::ConvergencePoint PointAt(int64_t batches) {
  auto point = ConvergencePointOf(batches, batches * 10, {1.0 / batches});
  return *point;
}

std::vector<int64_t> Batches(const std::vector<v1::ConvergencePoint>& points) {
  std::vector<int64_t> batches;
  for (const auto& p : points) batches.push_back(p.batches());
  return batches;
}

TEST(ConvergencePoint, MedianAndWorstOverTheLayersWithAnEstimate) {
  const double inf = std::numeric_limits<double>::infinity();
  auto point = ConvergencePointOf(7, 70, {0.3, inf, 0.1, 0.2, 0.4});
  ASSERT_TRUE(point.has_value());
  EXPECT_EQ(point->batches(), 7);
  EXPECT_EQ(point->samples(), 70);
  EXPECT_EQ(point->layers(), 4) << "the layer without an estimate is left out";
  EXPECT_DOUBLE_EQ(point->median_rel_std_error(), 0.2) << "the lower middle of four";
  EXPECT_DOUBLE_EQ(point->max_rel_std_error(), 0.4) << "not the infinite one";
  EXPECT_FALSE(ConvergencePointOf(1, 10, {inf, inf}).has_value());
  EXPECT_FALSE(ConvergencePointOf(1, 10, {}).has_value());
}

TEST(ConvergenceHistory, ShortRunKeepsEveryBatch) {
  ConvergenceHistory history(8);
  for (int64_t b = 2; b <= 6; ++b) {
    ASSERT_TRUE(history.Wants(b));
    history.Add(PointAt(b));
  }
  EXPECT_EQ(Batches(history.Points(std::nullopt)), (std::vector<int64_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(Batches(history.Points(PointAt(6))), (std::vector<int64_t>{2, 3, 4, 5, 6})) << "no duplicate last";
}

TEST(ConvergenceHistory, LongRunStaysBoundedEvenlySpacedWithFirstAndLast) {
  constexpr int kCapacity = 16;
  ConvergenceHistory history(kCapacity);
  const int64_t last = 100'003;
  for (int64_t b = 3; b <= last; ++b) {
    if (history.Wants(b)) history.Add(PointAt(b));
    ASSERT_LE(history.Points(std::nullopt).size(), static_cast<size_t>(kCapacity)) << "at batch " << b;
  }
  const std::vector<int64_t> kept = Batches(history.Points(PointAt(last)));
  ASSERT_GE(kept.size(), static_cast<size_t>(kCapacity / 2));
  ASSERT_LE(kept.size(), static_cast<size_t>(kCapacity + 1));
  EXPECT_EQ(kept.front(), 3) << "the first point stays";
  EXPECT_EQ(kept.back(), last) << "the last batch's point is appended";
  // Between the first and the last: one stride apart, the stride a power of two.
  const int64_t stride = kept[2] - kept[1];
  EXPECT_EQ(stride & (stride - 1), 0) << stride;
  for (size_t i = 2; i + 1 < kept.size(); ++i) EXPECT_EQ(kept[i] - kept[i - 1], stride) << i;
  EXPECT_LT(last - kept[kept.size() - 2], stride);
  EXPECT_LE(stride, 2 * last / (kCapacity - 1)) << "thinned no more than needed";
}

TEST(ConvergenceHistory, AbandonedHistoryStaysEmpty) {
  ConvergenceHistory history;
  history.Add(PointAt(2));
  history.Abandon();
  EXPECT_FALSE(history.Wants(3));
  history.Add(PointAt(3));
  EXPECT_TRUE(history.Points(PointAt(4)).empty());
}

// Two BatchNorm layers, the second on a heavier-tailed input: their errors differ.
torch::jit::Module MakeTwoLayerNet(int64_t channels) {
  torch::jit::Module net("TwoLayerNet");
  net.register_attribute("training", c10::BoolType::get(), true);
  net.register_module("first", MakeBatchNorm(channels));
  net.register_module("second", MakeBatchNorm(channels));
  net.define(R"(
def forward(self, x):
    y = self.first.forward(x)
    return self.second.forward(y * y * y)
)");
  return net;
}

std::vector<at::Tensor> Batches(int count, int64_t batch_size) {
  at::manual_seed(21);
  std::vector<at::Tensor> batches;
  for (int i = 0; i < count; ++i) batches.push_back(at::randn({batch_size, 3}) * 2 + 1);
  return batches;
}

TEST(Recalibration, ReportRecordsABoundedHistoryEndingAtTheFinalError) {
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeTwoLayerNet(3), tmp.File("net.pt"));
  Options options;
  options.max_batches = 300;
  auto run = Recalibration::Create(model, options);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE((*run)->Run(FeedFrom(Batches(300, 8))).ok());
  const v1::RunReport report = (*run)->Report();
  const auto& history = report.convergence();
  ASSERT_GT(history.size(), kConvergencePoints / 2);
  EXPECT_LE(history.size(), kConvergencePoints + 1);
  // Every layer runs once a batch: the first estimate is after the second batch.
  EXPECT_EQ(history[0].batches(), 2);
  EXPECT_EQ(history[history.size() - 1].batches(), 300);
  for (int i = 0; i < history.size(); ++i) {
    EXPECT_EQ(history[i].samples(), 8 * history[i].batches()) << i;
    EXPECT_EQ(history[i].layers(), 2) << i;
    EXPECT_LE(history[i].median_rel_std_error(), history[i].max_rel_std_error()) << i;
    if (i > 0) {
      EXPECT_GT(history[i].batches(), history[i - 1].batches()) << i;
    }
  }
  // The last point is the final error of the layers, as the report states it.
  std::vector<double> errors;
  for (const v1::LayerReport& layer : report.layers()) {
    if (layer.rel_std_error() >= 0) errors.push_back(layer.rel_std_error());
  }
  ASSERT_EQ(errors.size(), 2u);
  std::sort(errors.begin(), errors.end());
  const v1::ConvergencePoint& last = history[history.size() - 1];
  EXPECT_EQ(last.max_rel_std_error(), errors[1]);
  EXPECT_EQ(last.median_rel_std_error(), errors[0]);
  EXPECT_EQ(last.max_rel_std_error(), (*run)->RelStdError());
  // 150 times the data: the error shrinks by about sqrt(150).
  EXPECT_LT(last.max_rel_std_error(), history[0].max_rel_std_error() / 4);
}

TEST(Recalibration, ReportOfAShortRunHasAPointPerBatch) {
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeTwoLayerNet(3), tmp.File("net.pt"));
  auto run = Recalibration::Create(model, {});
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE((*run)->Run(FeedFrom(Batches(5, 8))).ok());
  const v1::RunReport report = (*run)->Report();
  ASSERT_EQ(report.convergence_size(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(report.convergence(i).batches(), i + 2);
  EXPECT_EQ(report.convergence(3).max_rel_std_error(), (*run)->RelStdError());
}

TEST(Recalibration, MergedShardsReportNoHistory) {
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(MakeTwoLayerNet(3), tmp.File("net.pt"));
  auto a = Recalibration::Create(model, {});
  auto b = Recalibration::Create(model, {});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->RunShard(FeedFrom(Batches(4, 8))).ok());
  ASSERT_TRUE((*b)->RunShard(FeedFrom(Batches(3, 8))).ok());
  EXPECT_EQ((*b)->Report().convergence_size(), 2) << "a shard's own report has its history";
  ASSERT_TRUE((*a)->Merge((*b)->Statistics()).ok());
  ASSERT_TRUE((*a)->Finish().ok());
  EXPECT_EQ((*a)->Report().convergence_size(), 0) << "shard 0 merging the others";

  auto merge = Recalibration::Create(model, {});  // the merge task's: no batch of its own
  ASSERT_TRUE(merge.ok());
  ASSERT_TRUE((*merge)->Merge((*b)->Statistics()).ok());
  ASSERT_TRUE((*merge)->Finish().ok());
  EXPECT_EQ((*merge)->Report().convergence_size(), 0);
}

}  // namespace
}  // namespace recal::engine
