// Random masks a train-mode export bakes in, under modules=eval: what the graph proves to be
// stochastic depth runs as eval mode runs it (the identity; the fixture `stochastic_depth`
// against the float64 reference proves the statistics, reference_test), and every other use
// of a random draw is refused, naming it, instead of giving other statistics without a word.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include "server/engine/recalibration.h"
#include "tests/engine/program_edits.h"
#include "tests/engine/test_util.h"

namespace recal::engine {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using nlohmann::json;
using testing::Edited;
using testing::NodeWith;
using testing::Nodes;

// Four residual blocks, each through another stochastic depth: timm's drop_path with
// scale_by_keep (bernoulli_, div_, mul), without (bernoulli_, mul), torchvision's at p=1
// (bernoulli_(0), mul) and by batch (one draw for the batch).
const std::string kMasks = testing::FixtureModel("stochastic_depth.exported_train.pt2");

absl::StatusOr<std::unique_ptr<Recalibration>> Create(const std::string& path, v1::ModuleMode modules) {
  Options options;
  options.preload_output_copy = false;
  options.modules = modules;
  return Recalibration::Create(path, options);
}

// The running statistics after a run over the same two batches.
std::map<std::string, at::Tensor> Statistics(const std::string& path, v1::ModuleMode modules) {
  auto run = Create(path, modules);
  EXPECT_TRUE(run.ok()) << run.status();
  if (!run.ok()) return {};
  at::manual_seed(7);
  std::vector<at::Tensor> batches{at::randn({8, 3, 12, 12}), at::randn({5, 3, 12, 12})};
  const absl::Status ran = (*run)->Run(testing::FeedFrom(batches));
  EXPECT_TRUE(ran.ok()) << ran;
  const std::string out = testing::TempPath("masks.safetensors");
  EXPECT_TRUE((*run)->WriteBatchNormBuffers(out).ok());
  return testing::ReadSafetensors(out);
}

// The n-th node (0-based) whose target contains `part`.
json& NthNode(json& program, const std::string& part, int n) {
  for (json& node : Nodes(program)) {
    if (node["target"].get<std::string>().find(part) != std::string::npos && n-- == 0) return node;
  }
  throw std::runtime_error("no such node");
}

void ExpectRefusedUnderEval(const std::string& path, const std::string& node) {
  const absl::Status refused = Create(path, v1::EVAL).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), AllOf(HasSubstr(node), HasSubstr("export the model in eval mode")));
  EXPECT_TRUE(Create(path, v1::TRAIN).ok()) << "modules=train keeps the randomness and runs";
}

TEST(ExportedEvalModeTest, StochasticDepthRunsDeterministicallyUnderEval) {
  // Under eval the masks do not run: two runs agree to the bit. Under train they draw.
  const auto first = Statistics(kMasks, v1::EVAL);
  const auto second = Statistics(kMasks, v1::EVAL);
  ASSERT_FALSE(first.empty());
  for (const auto& [key, value] : first) EXPECT_TRUE(value.equal(second.at(key))) << key;
  const auto drawn = Statistics(kMasks, v1::TRAIN);
  bool differs = false;
  for (const auto& [key, value] : first) differs |= !value.equal(drawn.at(key));
  EXPECT_TRUE(differs) << "modules=train should keep the masks' randomness";
}

TEST(ExportedEvalModeTest, AMaskAddedInsteadOfMultipliedIsRefused) {
  const std::string path = Edited("mask_added", kMasks, [](json& p) {
    NthNode(p, "aten.mul.Tensor", 0)["target"] = "torch.ops.aten.add.Tensor";
  });
  ExpectRefusedUnderEval(path, "bernoulli");
}

TEST(ExportedEvalModeTest, AMaskDividedByAnotherNumberThanItsKeepProbabilityIsRefused) {
  const std::string path = Edited("mask_scaled", kMasks, [](json& p) {
    for (json& input : NodeWith(Nodes(p), "aten.div_")["inputs"]) {
      if (input["name"] == "other") input["arg"] = json{{"as_float", 0.5}};
    }
  });
  ExpectRefusedUnderEval(path, "bernoulli");
}

TEST(ExportedEvalModeTest, AMaskReadTwiceIsRefused) {
  // The multiply reads the mask for both operands: the mask has another reader than the
  // one that applies it to an activation.
  const std::string path = Edited("mask_twice", kMasks, [](json& p) {
    json& mul = NthNode(p, "aten.mul.Tensor", 1);  // x * mask, the draw without division
    json mask = mul["inputs"][1]["arg"];
    mul["inputs"][0]["arg"] = mask;
  });
  ExpectRefusedUnderEval(path, "bernoulli");
}

TEST(ExportedEvalModeTest, ADrawIntoATensorThatIsNotFreshIsRefused) {
  // bernoulli_ overwrites an activation that something else reads: not a mask of its own.
  const std::string path = Edited("draw_into_activation", kMasks, [](json& p) {
    json& draw = NthNode(p, "aten.bernoulli_", 1);
    json& mul = NthNode(p, "aten.mul.Tensor", 1);
    draw["inputs"][0]["arg"] = mul["inputs"][0]["arg"];
  });
  ExpectRefusedUnderEval(path, "bernoulli");
}

TEST(ExportedEvalModeTest, TheOutOverloadIsJudgedByItsSchemaNotItsName) {
  // bernoulli.out(self, *, generator, out): its probabilities are a tensor and it writes
  // `out`. Not a keep probability the graph states: refused under eval; under train it runs
  // and writes `out` (the schema says which argument it writes).
  const std::string path = Edited("bernoulli_out", kMasks, [](json& p) {
    json& draw = NthNode(p, "aten.bernoulli_", 1);
    json fresh = draw["inputs"][0]["arg"];
    draw["target"] = "torch.ops.aten.bernoulli.out";
    draw["inputs"] = json::array({json{{"name", "self"}, {"arg", fresh}, {"kind", 1}},
                                  json{{"name", "out"}, {"arg", fresh}, {"kind", 2}}});
  });
  ExpectRefusedUnderEval(path, "aten::bernoulli");
}

}  // namespace
}  // namespace recal::engine
