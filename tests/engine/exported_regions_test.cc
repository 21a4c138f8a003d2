// The higher-order operators of exported programs: the regions users write inside forward
// (torch.no_grad / enable_grad, torch.autocast, activation checkpointing) and torch.cond run
// as the eager model runs them, their nested graphs held to the same allowlist and bounds as
// the program's own. The fixtures `regions` and `cond_bn` against the float64 reference
// prove the statistics (reference_test); these tests prove what an edit of them changes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include "server/engine/recalibration.h"
#include "tests/engine/program_edits.h"
#include "tests/engine/test_util.h"

namespace recal::engine {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;
using testing::Edited;
using testing::ExpectRefused;
using testing::GraphArgument;
using testing::NodeWith;
using testing::Nodes;

// conv, BatchNorm in a no_grad region; a convolution in a bfloat16 autocast region; two
// BatchNorms; a torch.cond on the data; a last BatchNorm. Exported in train mode.
const std::string kRegions = testing::FixtureModel("regions.exported_train.pt2");

// The new statistics after a run over the same three batches, by state_dict key.
std::map<std::string, at::Tensor> Statistics(const std::string& path) {
  Options options;
  options.preload_output_copy = false;
  auto run = Recalibration::Create(path, options);
  EXPECT_TRUE(run.ok()) << run.status();
  if (!run.ok()) return {};
  at::manual_seed(11);
  std::vector<at::Tensor> batches{at::randn({6, 3, 10, 10}), at::randn({6, 3, 10, 10}), at::randn({3, 3, 10, 10})};
  const absl::Status ran = (*run)->Run(testing::FeedFrom(batches));
  EXPECT_TRUE(ran.ok()) << ran;
  const std::string out = testing::TempPath("regions.safetensors");
  EXPECT_TRUE((*run)->WriteBatchNormBuffers(out).ok());
  return testing::ReadSafetensors(out);
}

TEST(ExportedRegionsTest, AnAutocastRegionRunsInItsPrecision) {
  // The same program with the region's autocast disabled: the convolution in float32. Only
  // the layers after it see other values.
  const std::string float32 = Edited("autocast_off", kRegions, [](json& p) {
    NodeWith(Nodes(p), "wrap_with_autocast")["inputs"][2]["arg"] = json{{"as_bool", false}};
  });
  const auto autocast = Statistics(kRegions);
  const auto plain = Statistics(float32);
  ASSERT_FALSE(autocast.empty());
  EXPECT_TRUE(autocast.at("bn.running_var").equal(plain.at("bn.running_var")));
  EXPECT_FALSE(autocast.at("bn2.running_var").equal(plain.at("bn2.running_var")));
  const double moved = (autocast.at("bn2.running_var") / plain.at("bn2.running_var") - 1).abs().max().item<double>();
  EXPECT_GT(moved, 1e-5) << "bfloat16 rounding of the convolution's output shows in its statistics";
  EXPECT_LT(moved, 0.1);
}

TEST(ExportedRegionsTest, ActivationCheckpointingRunsItsGraph) {
  // torch 2.14 exports no tag_activation_checkpoint that its own loader reads back; the
  // no_grad region rewritten as one (its graph first, then the operands) runs the same.
  const std::string checkpointed = Edited("checkpoint", kRegions, [](json& p) {
    json& region = NodeWith(Nodes(p), "wrap_with_set_grad_enabled");
    region["target"] = "torch.ops.higher_order.tag_activation_checkpoint";
    region["inputs"].erase(region["inputs"].begin());
    region["inputs"].push_back(json{{"name", "use_reentrant"}, {"arg", json{{"as_bool", false}}}, {"kind", 2}});
  });
  const auto original = Statistics(kRegions);
  const auto rewritten = Statistics(checkpointed);
  ASSERT_FALSE(original.empty());
  for (const auto& [key, value] : original) EXPECT_TRUE(value.equal(rewritten.at(key))) << key;
}

TEST(ExportedRegionsTest, HigherOrderOperatorsOtherThanTheFourAreRefused) {
  const std::string path = Edited("while_loop", kRegions, [](json& p) {
    NodeWith(Nodes(p), "higher_order.cond")["target"] = "torch.ops.higher_order.while_loop";
  });
  ExpectRefused(path, "a higher-order operator Recal does not run");
}

TEST(ExportedRegionsTest, TheAllowlistHoldsInsideNestedGraphs) {
  const std::string path = Edited("nested_from_file", kRegions, [](json& p) {
    json& region = NodeWith(Nodes(p), "wrap_with_set_grad_enabled");
    NodeWith(GraphArgument(region, 1)["nodes"], "conv2d")["target"] = "torch.ops.aten.from_file.default";
  });
  ExpectRefused(path, "operator aten::from_file is not allowed");
}

TEST(ExportedRegionsTest, NestedNodesCountAgainstTheNodeLimit) {
  Options options;
  options.preload_output_copy = false;
  json program;
  // The program's own nodes fit; with the regions' nodes they do not.
  const std::string path = Edited("count", kRegions, [&](json& p) { program = p; });
  options.graph_policy.max_graph_nodes = static_cast<int64_t>(Nodes(program).size());
  const absl::Status status = Recalibration::Create(path, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("nested graphs included"));
}

TEST(ExportedRegionsTest, GraphsNestedTooDeepAreRefused) {
  // The no_grad region's graph wrapped in itself: 6 graphs deep, within the JSON's depth limit.
  const std::string path = Edited("deep", kRegions, [](json& p) {
    json& region = NodeWith(Nodes(p), "wrap_with_set_grad_enabled");
    for (int i = 0; i < 5; ++i) {
      json inner = region;
      json& graph = GraphArgument(region, 1);
      graph["nodes"] = json::array({inner});
    }
  });
  ExpectRefused(path, "is nested 6 deep, more than the 5 Recal runs");
}

TEST(ExportedRegionsTest, ACondWhosePredicateIsNotOneValueFailsTheBatchNamingIt) {
  // The predicate replaced by a whole activation: refused when it runs, not read as its first value.
  const std::string path = Edited("cond_tensor", kRegions, [](json& p) {
    json& cond = NodeWith(Nodes(p), "higher_order.cond");
    cond["inputs"][0]["arg"] = json{{"as_tensor", cond["inputs"][3]["arg"]["as_tensors"][0]}};
  });
  Options options;
  options.preload_output_copy = false;
  auto run = Recalibration::Create(path, options);
  ASSERT_TRUE(run.ok()) << run.status();
  const absl::Status fed = (*run)->Feed({at::randn({2, 3, 10, 10})});
  EXPECT_FALSE(fed.ok());
  EXPECT_THAT(fed.message(), HasSubstr("torch.cond's predicate has"));
}

TEST(ExportedRegionsTest, AGraphWhereAnOperatorTakesATensorIsRefused) {
  // as_graph is for higher-order operators only.
  const std::string path = Edited("graph_argument", kRegions, [](json& p) {
    const json region = NodeWith(Nodes(p), "wrap_with_set_grad_enabled");
    NodeWith(Nodes(p), "aten.conv2d")["inputs"][0]["arg"] = region["inputs"][1]["arg"];
  });
  ExpectRefused(path, "argument 'input' is as_graph");
}

}  // namespace
}  // namespace recal::engine
