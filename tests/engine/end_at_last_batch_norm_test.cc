// The forward the engine runs ends at the last observed BatchNorm (Options::
// end_at_last_batch_norm): what only the output needed is cut, every statistic and every
// state change the model makes to itself stays exactly as in the whole forward.
#include <gtest/gtest.h>
#include <torch/script.h>

#include "server/engine/recalibration.h"
#include "tests/engine/test_util.h"
#include "tests/test_util.h"

namespace recal::engine {
namespace {

using testing::FeedFrom;
using testing::MakeBatchNorm;
using testing::ReadSafetensors;
using testing::SaveModule;

// Buffers written by a run of `model` over `batches`, and the nodes its forward cut.
std::pair<std::map<std::string, at::Tensor>, int> RunAndRead(const std::string& model,
                                                            const std::vector<at::Tensor>& batches,
                                                            bool end_at_last_batch_norm,
                                                            const std::string& out) {
  Options options;
  options.end_at_last_batch_norm = end_at_last_batch_norm;
  auto run = Recalibration::Create(model, options);
  EXPECT_TRUE(run.ok()) << run.status();
  if (!run.ok()) return {};
  absl::Status ran = (*run)->Run(FeedFrom(batches));
  EXPECT_TRUE(ran.ok()) << ran;
  EXPECT_TRUE((*run)->WriteBatchNormBuffers(out).ok());
  return {ReadSafetensors(out), (*run)->forward_nodes_cut()};
}

// The same statistics, bit for bit, with and without the cut; returns the nodes cut.
int ExpectCutChangesNoStatistic(const torch::jit::Module& net, const std::vector<at::Tensor>& batches) {
  recal::testing::TempDir tmp;
  const std::string model = SaveModule(net, tmp.File("net.pt"));
  auto [whole, none_cut] = RunAndRead(model, batches, false, tmp.File("whole.safetensors"));
  auto [cut, nodes_cut] = RunAndRead(model, batches, true, tmp.File("cut.safetensors"));
  EXPECT_EQ(none_cut, 0);
  EXPECT_EQ(whole.size(), cut.size());
  for (const auto& [key, value] : whole) {
    EXPECT_TRUE(cut.count(key) && cut[key].equal(value)) << key << "\nwhole forward " << value << "\ncut forward " << cut[key];
  }
  return nodes_cut;
}

std::vector<at::Tensor> Batches(int count) {
  at::manual_seed(11);
  std::vector<at::Tensor> batches;
  for (int i = 0; i < count; ++i) batches.push_back(at::randn({6, 4}) * (i + 1) + i);
  return batches;
}

TEST(EndAtLastBatchNorm, HeadReturningATupleWithADictIsCutAndStatisticsAreUnchanged) {
  torch::jit::Module net("Net");
  net.register_attribute("training", c10::BoolType::get(), false);
  net.register_module("first", MakeBatchNorm(4));
  net.register_module("last", MakeBatchNorm(4));
  net.register_parameter("head", at::randn({4, 64}), false);
  net.define(R"(
def forward(self, x):
    h = self.first.forward(x).relu()
    z = self.last.forward(h * 2.0 + 1.0)
    logits = torch.mm(torch.mm(z, self.head).tanh(), self.head.t())
    return logits, {"features": h, "normalized": z}
)");
  EXPECT_GE(ExpectCutChangesNoStatistic(net, Batches(3)), 4);  // mm, tanh, t, mm at least
}

TEST(EndAtLastBatchNorm, LastBatchNormInsideABranchCutsAfterTheBranch) {
  torch::jit::Module net("Net");
  net.register_attribute("training", c10::BoolType::get(), false);
  net.register_module("first", MakeBatchNorm(4));
  net.register_module("inner", MakeBatchNorm(4));
  net.define(R"(
def forward(self, x):
    h = self.first.forward(x)
    if bool(h.sum() > -1.0e30):
        h = self.inner.forward(h.exp())
    else:
        h = h * 3.0
    return h.sigmoid().sum(1)
)");
  EXPECT_GE(ExpectCutChangesNoStatistic(net, Batches(3)), 2);
}

TEST(EndAtLastBatchNorm, StateTheModelWritesAfterItsLastBatchNormIsStillWritten) {
  // After the last BatchNorm the model writes an attribute (prim::SetAttr) and a buffer in
  // place (aten::add_); the next batch's BatchNorm input depends on both. Cutting either
  // write would change every statistic after the first batch.
  torch::jit::Module net("Net");
  net.register_attribute("training", c10::BoolType::get(), false);
  net.register_attribute("scale", c10::FloatType::get(), 1.0);
  net.register_buffer("shift", at::zeros({4}));
  net.register_module("bn", MakeBatchNorm(4));
  net.define(R"(
def forward(self, x):
    y = self.bn.forward(x * self.scale + self.shift)
    self.scale = self.scale * 2.0
    self.shift.add_(y.mean(0))
    return y.relu()
)");
  ExpectCutChangesNoStatistic(net, Batches(4));
}

TEST(EndAtLastBatchNorm, ALoopCallingTheBatchNormEndsTheForwardAfterTheLoop) {
  torch::jit::Module net("Net");
  net.register_attribute("training", c10::BoolType::get(), false);
  net.register_module("bn", MakeBatchNorm(4));
  net.define(R"(
def forward(self, x):
    for i in range(3):
        x = self.bn.forward(x) * 0.5 + float(i)
    return [x.exp(), x.cos()]
)");
  EXPECT_GE(ExpectCutChangesNoStatistic(net, Batches(2)), 3);
}

TEST(EndAtLastBatchNorm, SavedModelKeepsItsWholeForward) {
  // Only the observed copy is cut: the written archive returns what it returned before.
  recal::testing::TempDir tmp;
  torch::jit::Module net("Net");
  net.register_attribute("training", c10::BoolType::get(), false);
  net.register_module("bn", MakeBatchNorm(4));
  net.define(R"(
def forward(self, x):
    y = self.bn.forward(x)
    return y.sum(1), {"y": y}
)");
  const std::string model = SaveModule(net, tmp.File("net.pt"));
  auto run = Recalibration::Create(model, {});
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_TRUE((*run)->Run(FeedFrom(Batches(2))).ok());
  EXPECT_GT((*run)->forward_nodes_cut(), 0);
  ASSERT_TRUE((*run)->WriteModel(tmp.File("out.pt")).ok());
  torch::jit::Module out = torch::jit::load(tmp.File("out.pt"));
  c10::IValue result = out.forward({at::randn({3, 4})});
  ASSERT_TRUE(result.isTuple());
  EXPECT_TRUE(result.toTupleRef().elements()[1].isGenericDict());
}

}  // namespace
}  // namespace recal::engine
