// The input contract's one check (common/input_contract.h), as torch's
// ExportedProgram.module() enforces it, with messages that name the input, the dimension,
// what the data gives, what the program was exported for and the fix.
#include "common/input_contract.h"

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace recal {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

v1::InputDim Fixed(int64_t size) {
  v1::InputDim dim;
  dim.set_fixed(size);
  return dim;
}

// coefficient * symbol + offset, the symbol in [min, max] (no max: unbounded).
v1::InputDim Dynamic(const std::string& symbol, int64_t min, std::optional<int64_t> max, int64_t coefficient = 1,
                     int64_t offset = 0) {
  v1::InputDim dim;
  v1::DynamicSize* size = dim.mutable_dynamic();
  size->set_symbol(symbol);
  size->set_coefficient(coefficient);
  size->set_offset(offset);
  size->set_min(min);
  if (max) size->set_max(*max);
  return dim;
}

v1::ModelInput Input(const std::string& name, const std::string& dtype, const std::vector<v1::InputDim>& dims) {
  v1::ModelInput input;
  input.set_name(name);
  input.set_dtype(dtype);
  for (const v1::InputDim& dim : dims) *input.add_dims() = dim;
  return input;
}

ModelInputs Inputs(const std::vector<v1::ModelInput>& inputs) {
  ModelInputs all;
  for (const v1::ModelInput& input : inputs) *all.Add() = input;
  return all;
}

// An image model exported with a dynamic batch (min=1) at 3x32x32.
ModelInputs Static32() { return Inputs({Input("x", "float32", {Dynamic("s0", 1, {}), Fixed(3), Fixed(32), Fixed(32)})}); }

// The same with H = W one Dim in 8..64.
ModelInputs Bounded() {
  return Inputs({Input("x", "float32", {Dynamic("s0", 1, {}), Fixed(3), Dynamic("s1", 8, 64), Dynamic("s1", 8, 64)})});
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(InputContract, StaticSizeRefusedNamingInputDimSizesAndFix) {
  const absl::Status status = CheckBatch(Static32(), {{{8, 3, 16, 16}, "float32"}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status), AllOf(HasSubstr("input 'x' dim 2 is 16, but the program was exported for exactly 32"),
                                     HasSubstr("the data gives 8x3x16x16 float32"),
                                     HasSubstr("the program takes x: float32 [s0, 3, 32, 32]"),
                                     HasSubstr("resize or crop"), HasSubstr("dynamic_shapes")));
  EXPECT_TRUE(CheckBatch(Static32(), {{{8, 3, 32, 32}, "float32"}}).ok());
  EXPECT_TRUE(CheckBatch(Static32(), {{{1, 3, 32, 32}, "float32"}}).ok());
}

TEST(InputContract, ChannelsThatDoNotFitNameTheDimension) {
  EXPECT_THAT(Message(CheckBatch(Static32(), {{{8, 4, 32, 32}, "float32"}})),
              HasSubstr("input 'x' dim 1 is 4, but the program was exported for exactly 3"));
}

TEST(InputContract, DimRangeAndEqualityAsTorchGuardsThem) {
  EXPECT_TRUE(CheckBatch(Bounded(), {{{2, 3, 32, 32}, "float32"}}).ok());
  EXPECT_THAT(Message(CheckBatch(Bounded(), {{{2, 3, 80, 80}, "float32"}})),
              AllOf(HasSubstr("input 'x' dim 2 is 80, but the program was exported for a torch.export.Dim there "
                              "(s1: 8..64)"),
                    HasSubstr("min and max")));
  EXPECT_THAT(Message(CheckBatch(Bounded(), {{{2, 3, 4, 4}, "float32"}})), HasSubstr("dim 2 is 4"));
  EXPECT_THAT(Message(CheckBatch(Bounded(), {{{2, 3, 16, 20}, "float32"}})),
              HasSubstr("input 'x' dim 3 is 20, but the program was exported with it equal to input 'x' dim 2, "
                        "which is 16: one torch.export.Dim, s1, for both (the data gives"));
}

TEST(InputContract, LowerBoundsOfTwoOrLessAreNotEnforced) {
  // Export specialises 0 and 1 (Dim.AUTO gives a batch 2..): torch lets a batch of 1 pass.
  const ModelInputs auto_batch = Inputs({Input("x", "float32", {Dynamic("s0", 2, {}), Fixed(3)})});
  EXPECT_TRUE(CheckBatch(auto_batch, {{{1, 3}, "float32"}}).ok());
  const ModelInputs four_up = Inputs({Input("x", "float32", {Dynamic("s0", 4, {}), Fixed(3)})});
  EXPECT_THAT(Message(CheckBatch(four_up, {{{1, 3}, "float32"}})),
              HasSubstr("input 'x' dim 0 (the batch) is 1, but the program was exported for a torch.export.Dim there "
                        "(s0: at least 4)"));
}

TEST(InputContract, InputsShareTheirBatch) {
  const ModelInputs two = Inputs({Input("x", "float32", {Dynamic("s0", 1, {}), Fixed(3)}),
                                  Input("y", "float32", {Dynamic("s0", 1, {}), Fixed(5)})});
  EXPECT_TRUE(CheckBatch(two, {{{2, 3}, "float32"}, {{2, 5}, "float32"}}).ok());
  EXPECT_THAT(Message(CheckBatch(two, {{{2, 3}, "float32"}, {{3, 5}, "float32"}})),
              AllOf(HasSubstr("input 'y' dim 0 (the batch) is 3, but input 'x' dim 0 (the batch) is 2"),
                    HasSubstr("the same number of samples")));
}

TEST(InputContract, DerivedDimsMustBeMetByAWholeSymbol) {
  // x: [batch, d], y: [batch, 2*d + 1], d in 2..16, as torch.export writes Dim arithmetic.
  const ModelInputs derived = Inputs({Input("x", "float32", {Dynamic("s0", 1, {}), Dynamic("s1", 2, 16)}),
                                      Input("y", "float32", {Dynamic("s0", 1, {}), Dynamic("s1", 2, 16, 2, 1)})});
  EXPECT_TRUE(CheckBatch(derived, {{{2, 16}, "float32"}, {{2, 33}, "float32"}}).ok());
  EXPECT_THAT(Message(CheckBatch(derived, {{{2, 16}, "float32"}, {{2, 12}, "float32"}})),
              HasSubstr("input 'y' dim 1 is 12, but the program was exported with it 2*s1+1 = 33, s1 being 16 from "
                        "input 'x' dim 1 (the data gives"));
  // y alone binds d: 12 is no 2*d + 1 (torch's own check lets it through as d = 5.5).
  const ModelInputs alone = Inputs({Input("y", "float32", {Dynamic("s0", 1, {}), Dynamic("s1", 2, 16, 2, 1)})});
  EXPECT_TRUE(CheckBatch(alone, {{{2, 11}, "float32"}}).ok());
  EXPECT_THAT(Message(CheckBatch(alone, {{{2, 12}, "float32"}})),
              HasSubstr("input 'y' dim 1 is 12, but the program was exported for 2*s1+1 there, and no whole s1 gives "
                        "that"));
  EXPECT_THAT(Message(CheckBatch(alone, {{{2, 35}, "float32"}})),
              HasSubstr("is 35 (2*s1+1 with s1 = 17), but the program was exported for a torch.export.Dim there "
                        "(s1: 2..16)"));
}

TEST(InputContract, StaticBatchSaysWhichBatchSize) {
  const ModelInputs static_batch = Inputs({Input("x", "float32", {Fixed(8), Fixed(3)})});
  EXPECT_THAT(Message(CheckBatch(static_batch, {{{32, 3}, "float32"}})),
              AllOf(HasSubstr("input 'x' dim 0 (the batch) is 32, but the program was exported for batches of exactly 8"),
                    HasSubstr("batch_size 8"), HasSubstr("torch.export.Dim(\"batch\", min=1)")));
}

TEST(InputContract, CountAndRank) {
  const ModelInputs two = Inputs({Input("x", "float32", {Dynamic("s0", 1, {})}), Input("y", "int64", {Dynamic("s0", 1, {})})});
  EXPECT_THAT(Message(CheckBatch(two, {{{2}, "float32"}})),
              AllOf(HasSubstr("the model takes 2 tensor inputs (x, y), but the data gives 1 per batch"),
                    HasSubstr("safetensors")));
  EXPECT_THAT(Message(CheckBatch(Static32(), {{{8, 3, 32}, "float32"}})),
              AllOf(HasSubstr("input 'x' has 3 dims, but the program was exported for 4"), HasSubstr("give 4-d data")));
}

TEST(InputContract, DtypesSayWhatToChange) {
  EXPECT_THAT(Message(CheckBatch(Static32(), {{{8, 3, 32, 32}, "int64"}})),
              AllOf(HasSubstr("input 'x' is int64, but the program takes float32"), HasSubstr("scale=255"),
                    HasSubstr("x.astype(np.float32)")));
  const ModelInputs ids = Inputs({Input("ids", "int64", {Dynamic("s0", 1, {}), Fixed(16)})});
  EXPECT_THAT(Message(CheckBatch(ids, {{{8, 16}, "float32"}})),
              AllOf(HasSubstr("input 'ids' is float32, but the program takes int64"),
                    HasSubstr("store the data as int64")));
  EXPECT_THAT(Message(CheckBatch(ids, {{{8, 16}, "int32"}})), HasSubstr("x.astype(np.int64)"));
  EXPECT_TRUE(CheckBatch(ids, {{{8, 16}, "int64"}}).ok());
}

TEST(InputContract, FloatingDataForAnotherFloatingDtypeIsCastAndSaidSo) {
  EXPECT_TRUE(CheckBatch(Static32(), {{{8, 3, 32, 32}, "float64"}}).ok());
  EXPECT_THAT(CastNotes(Static32(), {{{3, 32, 32}, "float64"}}),
              ElementsAre("input 'x': float64 data is cast to float32, the dtype the program was exported with"));
  EXPECT_THAT(CastNotes(Static32(), {{{3, 32, 32}, "float32"}}), IsEmpty());
}

TEST(InputContract, TorchScriptChecksTheTensorArguments) {
  v1::ModelInput x, mask;
  x.set_name("x");
  x.set_any_shape(true);
  mask.set_name("mask");
  mask.set_any_shape(true);
  mask.set_optional(true);
  const ModelInputs script = Inputs({x, mask});
  EXPECT_TRUE(CheckBatch(script, {{{8, 3, 7}, "float64"}}).ok());
  EXPECT_TRUE(CheckBatch(script, {{{8, 3, 7}, "float32"}, {{8}, "bool"}}).ok());
  EXPECT_THAT(Message(CheckBatch(script, {{{8}, "float32"}, {{8}, "float32"}, {{8}, "float32"}})),
              HasSubstr("the model takes 1 to 2 tensor inputs (x, mask), but the data gives 3 per batch"));
  EXPECT_EQ(DescribeInput(x), "x: tensor of any shape");
}

TEST(InputContract, NoContractOrUncheckedDimsAcceptAnything) {
  EXPECT_TRUE(CheckBatch(ModelInputs(), {{{8, 3}, "int64"}}).ok());
  v1::InputDim unread;
  unread.set_unchecked("FloorDiv(Symbol('s0'), Integer(2))");
  EXPECT_TRUE(CheckBatch(Inputs({Input("x", "float32", {Dynamic("s0", 1, {}), unread})}), {{{8, 5}, "float32"}}).ok());
}

TEST(InputContract, HostileContractValuesNeitherCrashNorRefuse) {
  // A contract comes from the sandboxed worker: a coefficient of 0 or less is left unchecked,
  // arithmetic that would overflow int64 refuses the dim instead of wrapping.
  const int64_t lowest = std::numeric_limits<int64_t>::min();
  EXPECT_TRUE(CheckBatch(Inputs({Input("x", "float32", {Dynamic("s0", 1, {}, 0, 5)})}), {{{8}, "float32"}}).ok());
  EXPECT_TRUE(CheckBatch(Inputs({Input("x", "float32", {Dynamic("s0", 1, {}, -2, 5)})}), {{{8}, "float32"}}).ok());
  EXPECT_FALSE(CheckBatch(Inputs({Input("x", "float32", {Dynamic("s0", 1, {}, 3, lowest)})}), {{{8}, "float32"}}).ok());
}

TEST(InputContract, DataChecksItsFullAndLastBatch) {
  const ModelInputs static_batch = Inputs({Input("x", "float32", {Fixed(8), Fixed(3)})});
  const DataShape twenty{{{{3}, "float32"}}, 20};
  EXPECT_THAT(Message(CheckData(static_batch, twenty, 32, 200)), HasSubstr("dim 0 (the batch) is 20"));
  EXPECT_THAT(Message(CheckData(static_batch, twenty, 8, 200)),
              AllOf(HasSubstr("the last batch holds 4 of the data's 20 samples (batches of 8): input 'x' dim 0 "
                              "(the batch) is 4"),
                    HasSubstr("a sample count that is a multiple of it")));
  EXPECT_TRUE(CheckData(static_batch, twenty, 8, 2).ok());  // max_batches 2: the last batch is never read
  EXPECT_TRUE(CheckData(static_batch, DataShape{{{{3}, "float32"}}, 16}, 8, 200).ok());
  EXPECT_TRUE(CheckData(static_batch, DataShape{{{{3}, "float32"}}, std::nullopt}, 8, 200).ok());
  EXPECT_THAT(Message(CheckData(Static32(), DataShape{{{{3, 16, 16}, "float32"}}, std::nullopt}, 8, 200)),
              HasSubstr("the data gives 8x3x16x16 float32"));
}

TEST(InputContract, DtypeReachingModelIsTheDataLayers) {
  EXPECT_EQ(DtypeReachingModel("uint8"), "float32");
  EXPECT_EQ(DtypeReachingModel("float16"), "float32");
  EXPECT_EQ(DtypeReachingModel("float32"), "float32");
  EXPECT_EQ(DtypeReachingModel("int64"), "int64");
  EXPECT_EQ(DtypeReachingModel("float64"), "float64");
  EXPECT_EQ(DtypeReachingModel("bfloat16"), "bfloat16");
}

}  // namespace
}  // namespace recal
