// The input contract as the engine enforces it on every batch, before the forward: read from
// programs as torch.export saved them (tests/fixtures/contract_programs.py), a batch that
// does not fit is refused naming the batch, the input, the dimension, what it gives and what
// the program was exported for, where the program would have run it (a convolution takes any
// resolution) or failed deep in ATen. TorchScript declares no shapes: its tensor arguments
// are counted.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "server/engine/exported/input_contract.h"
#include "server/engine/inspect.h"
#include "server/engine/recalibration.h"

namespace recal::engine {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Program(const std::string& name) { return std::string(RECAL_CONTRACT_DIR) + "/" + name; }

std::unique_ptr<Recalibration> Load(const std::string& name) {
  Options options;
  options.preload_output_copy = false;
  auto run = Recalibration::Create(Program(name), options);
  EXPECT_TRUE(run.ok()) << run.status();
  return run.ok() ? *std::move(run) : nullptr;
}

at::Tensor Images(int64_t n, int64_t c, int64_t h, int64_t w) { return torch::randn({n, c, h, w}); }

void ExpectRefused(Recalibration& run, const std::vector<at::Tensor>& batch, const std::string& says) {
  const absl::Status status = run.Feed(batch);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(says));
  EXPECT_EQ(run.batches(), 0);  // nothing was measured
}

TEST(InputContractTest, TheProgramsContractIsReadAsExported) {
  auto run = Load("static32.pt2");
  ASSERT_NE(run, nullptr);
  ASSERT_EQ(run->inputs().size(), 1);
  const v1::ModelInput& x = run->inputs()[0];
  EXPECT_EQ(x.name(), "x");
  EXPECT_EQ(x.dtype(), "float32");
  ASSERT_EQ(x.dims_size(), 4);
  ASSERT_TRUE(x.dims(0).has_dynamic());  // Dim("batch", min=1)
  EXPECT_EQ(x.dims(0).dynamic().coefficient(), 1);
  EXPECT_EQ(x.dims(0).dynamic().min(), 1);
  EXPECT_FALSE(x.dims(0).dynamic().has_max());
  EXPECT_EQ(x.dims(1).fixed(), 3);
  EXPECT_EQ(x.dims(2).fixed(), 32);
  EXPECT_EQ(x.dims(3).fixed(), 32);
}

TEST(InputContractTest, AStaticResolutionRefusesOtherImagesBeforeTheForward) {
  auto run = Load("static32.pt2");
  ASSERT_NE(run, nullptr);
  ExpectRefused(*run, {Images(8, 3, 16, 16)},
                "batch 0: input 'x' dim 2 is 16, but the program was exported for exactly 32 (the data gives "
                "8x3x16x16 float32");
  EXPECT_TRUE(run->Feed({Images(8, 3, 32, 32)}).ok());
  EXPECT_TRUE(run->Feed({Images(1, 3, 32, 32)}).ok());  // a last batch of one: the batch Dim's min is 1
}

TEST(InputContractTest, ChannelsThatDoNotFitSayWhichInputAndDimensionNotATensError) {
  auto run = Load("static32.pt2");
  ASSERT_NE(run, nullptr);
  const absl::Status status = run->Feed({Images(8, 4, 32, 32)});
  EXPECT_THAT(status.message(), AllOf(HasSubstr("input 'x' dim 1 is 4, but the program was exported for exactly 3"),
                                      Not(HasSubstr("expected input"))));
}

TEST(InputContractTest, ADimsRangeAndEqualityHold) {
  auto run = Load("bounded.pt2");
  ASSERT_NE(run, nullptr);
  ExpectRefused(*run, {Images(2, 3, 64, 64)}, "input 'x' dim 2 is 64, but the program was exported for a "
                                              "torch.export.Dim there (");
  ExpectRefused(*run, {Images(2, 3, 64, 64)}, ": 16..48)");
  ExpectRefused(*run, {Images(2, 3, 16, 24)}, "input 'x' dim 3 is 24, but the program was exported with it equal to "
                                              "input 'x' dim 2, which is 16");
  EXPECT_TRUE(run->Feed({Images(2, 3, 16, 16)}).ok());
  EXPECT_TRUE(run->Feed({Images(2, 3, 48, 48)}).ok());
}

TEST(InputContractTest, AStaticBatchTakesBatchesOfItsSizeOnly) {
  auto run = Load("static_batch.pt2");
  ASSERT_NE(run, nullptr);
  ExpectRefused(*run, {Images(2, 3, 8, 8)}, "input 'x' dim 0 (the batch) is 2, but the program was exported for "
                                            "batches of exactly 4");
  EXPECT_TRUE(run->Feed({Images(4, 3, 8, 8)}).ok());
}

TEST(InputContractTest, DerivedDimsAndASharedBatch) {
  auto run = Load("derived.pt2");
  ASSERT_NE(run, nullptr);
  ASSERT_EQ(run->inputs().size(), 2);
  const v1::DynamicSize& y = run->inputs()[1].dims(1).dynamic();  // 2*d + 1, d in 2..16
  EXPECT_EQ(y.coefficient(), 2);
  EXPECT_EQ(y.offset(), 1);
  EXPECT_EQ(y.min(), 2);
  EXPECT_EQ(y.max(), 16);
  ExpectRefused(*run, {Images(2, 3, 8, 8), torch::randn({2, 12})}, "input 'y' dim 1 is 12, but the program was "
                                                                   "exported for 2*");
  ExpectRefused(*run, {Images(2, 3, 8, 8), torch::randn({3, 11})}, "input 'y' dim 0 (the batch) is 3, but input 'x' "
                                                                   "dim 0 (the batch) is 2");
  ExpectRefused(*run, {Images(2, 3, 8, 8)}, "the model takes 2 tensor inputs (x, y), but the data gives 1 per batch");
  EXPECT_TRUE(run->Feed({Images(2, 3, 8, 8), torch::randn({2, 33})}).ok());
}

TEST(InputContractTest, DtypesTheEngineCannotCastSayWhatToChange) {
  auto tokens = Load("tokens.pt2");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->inputs()[0].dtype(), "int64");
  ExpectRefused(*tokens, {torch::rand({2, 6})}, "input 'ids' is float32, but the program takes int64");
  EXPECT_TRUE(tokens->Feed({torch::randint(0, 50, {2, 6})}).ok());
  auto images = Load("static32.pt2");
  ASSERT_NE(images, nullptr);
  ExpectRefused(*images, {torch::randint(0, 255, {2, 3, 32, 32})}, "input 'x' is int64, but the program takes float32");
  EXPECT_TRUE(images->Feed({Images(2, 3, 32, 32).to(torch::kFloat64)}).ok());  // cast, as documented
}

TEST(InputContractTest, TorchScriptCountsItsTensorArguments) {
  auto run = Load("static32.pt");
  ASSERT_NE(run, nullptr);
  ASSERT_EQ(run->inputs().size(), 1);
  EXPECT_EQ(run->inputs()[0].name(), "x");
  EXPECT_TRUE(run->inputs()[0].any_shape());
  ExpectRefused(*run, {Images(2, 3, 32, 32), Images(2, 3, 32, 32)},
                "the model takes 1 tensor input (x), but the data gives 2 per batch");
  EXPECT_TRUE(run->Feed({Images(2, 3, 16, 16)}).ok());  // a trace declares no shapes
}

TEST(InputContractTest, TheInspectionOfAnUploadCarriesTheContract) {
  auto inspection = InspectModel(Program("bounded.pt2"), GraphPolicy{});
  ASSERT_TRUE(inspection.ok()) << inspection.status();
  ASSERT_EQ(inspection->inputs.size(), 1);
  const v1::ModelInput& x = inspection->inputs[0];
  EXPECT_EQ(x.dims(2).dynamic().min(), 16);
  EXPECT_EQ(x.dims(2).dynamic().max(), 48);
  EXPECT_EQ(x.dims(2).dynamic().symbol(), x.dims(3).dynamic().symbol());
  EXPECT_NE(x.dims(0).dynamic().symbol(), x.dims(2).dynamic().symbol());
}

TEST(InputContractTest, SizesBeyondLinearDimsAreLeftUncheckedAndNonTensorInputsOut) {
  const nlohmann::json program = nlohmann::json::parse(R"json({
    "graph_module": {
      "graph": {"tensor_values": {"x": {"dtype": 7, "sizes": [
        {"as_expr": {"expr_str": "Symbol('s0', positive=True, integer=True)"}},
        {"as_expr": {"expr_str": "FloorDiv(Symbol('s0', positive=True, integer=True), Integer(2))"}},
        {"as_int": 5}]}}},
      "signature": {"input_specs": [
        {"user_input": {"arg": {"as_tensor": {"name": "x"}}}},
        {"user_input": {"arg": {"as_int": 3}}},
        {"buffer": {"arg": {"name": "b_bn_running_mean"}, "buffer_name": "bn.running_mean"}}]}},
    "range_constraints": {"s0": {"min_val": 3, "max_val": 9}, "2*s0 + 1": {"min_val": 7, "max_val": 19}}})json");
  const absl::StatusOr<ModelInputs> inputs = exported::ReadInputContract(program);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  ASSERT_EQ(inputs->size(), 1);
  EXPECT_EQ(DescribeInput((*inputs)[0]), "x: float32 [s0, ?, 5]");
  EXPECT_EQ((*inputs)[0].dims(0).dynamic().max(), 9);
  EXPECT_THAT((*inputs)[0].dims(1).unchecked(), HasSubstr("FloorDiv"));
  EXPECT_FALSE(exported::ReadInputContract(nlohmann::json::parse(R"({"graph_module": {}})")).ok());
}

}  // namespace
}  // namespace recal::engine
