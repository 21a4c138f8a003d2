// Graph validation on the hostile archives of tests/fixtures/hostile_models.py: each is
// refused before it runs, naming the operator and where it comes from; the allowlist can be
// extended by an administrator and skipped for a trusted file. Every fixture model of the
// zoo passing it is proven by reference_test, which validates as every run does.
#include "server/engine/graph_validation.h"

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "server/engine/recalibration.h"

namespace recal::engine {
namespace {

using ::testing::HasSubstr;

const std::string kHostile = std::string(RECAL_FIXTURES_DIR) + "/hostile/";

absl::Status CreateWith(const std::string& name, const GraphPolicy& policy = {}) {
  Options options;
  options.graph_policy = policy;
  return Recalibration::Create(kHostile + name + ".pt", options).status();
}

TEST(GraphValidation, OperatorsWithSideEffectsAreRefusedNamingOperatorAndSource) {
  for (const auto& [name, op] : std::vector<std::pair<std::string, std::string>>{
           {"reads_file", "aten::from_file"}, {"writes_file", "aten::save"}, {"prints", "prim::Print"}}) {
    const absl::Status status = CreateWith(name);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("operator " + op + " is not allowed")) << name;
    // The user's own source line, from the archive's debug information.
    EXPECT_THAT(status.message(), HasSubstr("hostile_models.py:")) << status;
  }
  EXPECT_FALSE(std::filesystem::exists(kHostile + "written.pt"));
}

TEST(GraphValidation, GraphThatExplodesWhenInlinedIsRefusedBeforeInlining) {
  const absl::Status status = CreateWith("exploding_graph");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("more than 500000 nodes"));
  Options small;
  small.graph_policy.max_graph_nodes = 100;
  EXPECT_THAT(Recalibration::Create(std::string(RECAL_FIXTURES_DIR) + "/models/resnet18.scripted_eval.pt",
                                    small)
                  .status()
                  .message(),
              HasSubstr("more than 100 nodes"));
}

TEST(GraphValidation, LoopsAndAllocationsPassForTheWorkerLimitsToStop) {
  EXPECT_TRUE(CreateWith("endless_loop").ok());
  EXPECT_TRUE(CreateWith("memory_bomb").ok());
}

TEST(GraphValidation, AdministratorsExtendTheListAndOwnersTrustTheirFiles) {
  GraphPolicy extended;
  extended.extra_allowed_ops = {"prim::Print"};
  EXPECT_TRUE(CreateWith("prints", extended).ok());
  EXPECT_FALSE(CreateWith("reads_file", extended).ok());
  GraphPolicy trusted;
  trusted.trusted = true;
  EXPECT_TRUE(CreateWith("reads_file", trusted).ok());  // created, never run here
}

TEST(GraphValidation, AllowlistHoldsNoOperatorWithSideEffects) {
  const std::vector<std::string> allowed = AllowedOperators();
  EXPECT_GT(allowed.size(), 100u);
  for (const char* op : {"aten::from_file", "aten::save", "aten::load", "prim::Print", "aten::sleep",
                         "aten::wait", "prim::fork", "aten::fork", "prim::PythonOp", "aten::manual_seed",
                         "recal::observed_batch_norm"}) {
    EXPECT_FALSE(std::binary_search(allowed.begin(), allowed.end(), op)) << op;
  }
  for (const std::string& op : allowed) {
    EXPECT_TRUE(absl::StartsWith(op, "aten::") || absl::StartsWith(op, "prim::")) << op;
  }
}

}  // namespace
}  // namespace recal::engine
