// Quantizers (server/engine/quantizers.h): the frozen fused quantizer against ATen's own, the
// quantized_decomposed operators against torch's Python ones, the refusals of quantizers with
// bad arguments, observers that do not move through a run (and a run that refuses one that
// does), the report's count, and iterations on the quantization-aware fixtures.
#include "server/engine/quantizers.h"

#include <fstream>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/formats/safetensors.h"
#include "common/mapped_file.h"
#include "server/data/batch_source.h"
#include "server/engine/recalibration.h"
#include "tests/engine/program_edits.h"
#include "tests/engine/test_util.h"
#include "tests/test_util.h"

namespace recal::engine {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;
using testing::Edited;
using testing::ExpectRefused;
using testing::FixtureModel;
using testing::NodeWith;
using testing::Nodes;

c10::OperatorHandle Op(const char* name, const char* overload = "") {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

at::Tensor CallOp(const c10::OperatorHandle& op, std::vector<c10::IValue> stack) {
  op.callBoxed(stack);
  return stack.at(0).toTensor();
}

// What a FusedMovingAvgObsFakeQuantize holds after training: its observer ran on `seen`,
// and ATen's fused operator wrote the scale and zero point.
struct Quantizer {
  at::Tensor observer_on = at::ones({1}, at::kLong), fake_quant_on = at::ones({1}, at::kLong);
  at::Tensor running_min, running_max, scale, zero_point;
  int64_t quant_min = 0, quant_max = 255, ch_axis = -1;
  bool per_row = false, symmetric = false;

  std::vector<c10::IValue> Arguments(const at::Tensor& x) const {
    return {x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, 0.01,
            quant_min, quant_max, ch_axis, per_row, symmetric};
  }
};

Quantizer Trained(const at::Tensor& seen, bool per_row) {
  Quantizer q;
  q.per_row = q.symmetric = per_row;
  if (per_row) {
    q.quant_min = -128, q.quant_max = 127, q.ch_axis = 0;
    q.running_min = at::full({seen.size(0)}, INFINITY), q.running_max = at::full({seen.size(0)}, -INFINITY);
    q.scale = at::ones({seen.size(0)}), q.zero_point = at::zeros({seen.size(0)}, at::kInt);
  } else {
    q.running_min = at::full({1}, INFINITY), q.running_max = at::full({1}, -INFINITY);
    q.scale = at::ones({1}), q.zero_point = at::zeros({1}, at::kInt);
  }
  CallOp(Op(kFusedFakeQuantizeOp), q.Arguments(seen));
  return q;
}

TEST(FrozenFakeQuantize, IsAtensWithTheObserverOffAndWritesNothing) {
  for (bool per_row : {false, true}) {
    const at::Tensor seen = at::randn({8, 4, 5, 5});
    Quantizer q = Trained(seen, per_row);
    // Data of another range than the observer saw: an observer would move.
    const at::Tensor x = 3 * at::randn({8, 4, 5, 5}) + 1;
    Quantizer held = q;
    for (at::Tensor* t : {&held.running_min, &held.running_max, &held.scale, &held.zero_point}) *t = t->clone();
    const at::Tensor frozen = CallOp(Op(kFrozenFakeQuantizeOp), held.Arguments(x));
    const std::vector<std::pair<at::Tensor, at::Tensor>> buffers = {
        {held.running_min, q.running_min}, {held.running_max, q.running_max}, {held.scale, q.scale},
        {held.zero_point, q.zero_point}};
    for (const auto& [now, before] : buffers) EXPECT_TRUE(now.equal(before)) << "per_row " << per_row;
    Quantizer off = q;
    off.observer_on = at::zeros({1}, at::kLong);
    const at::Tensor aten = CallOp(Op(kFusedFakeQuantizeOp), off.Arguments(x));
    EXPECT_TRUE(frozen.equal(aten)) << "per_row " << per_row;
    Quantizer on = Trained(seen, per_row);
    EXPECT_FALSE(frozen.equal(CallOp(Op(kFusedFakeQuantizeOp), on.Arguments(x)))) << "the observer did not move";
  }
}

TEST(FrozenFakeQuantize, AppliesTheStoredScaleNotOneRecomputedFromTheRange) {
  Quantizer q = Trained(at::randn({16, 3}), false);
  q.scale = q.scale * 2;  // a scale the range would not give (set by hand, or loaded)
  const at::Tensor x = at::randn({16, 3});
  const at::Tensor frozen = CallOp(Op(kFrozenFakeQuantizeOp), q.Arguments(x));
  EXPECT_TRUE(frozen.equal(at::fake_quantize_per_tensor_affine(x, q.scale, q.zero_point, 0, 255)));
}

TEST(FrozenFakeQuantize, PassesTheInputWhenFakeQuantizationIsOff) {
  Quantizer q = Trained(at::randn({4, 6}), false);
  q.fake_quant_on = at::zeros({1}, at::kLong);
  const at::Tensor x = at::randn({4, 6});
  EXPECT_TRUE(CallOp(Op(kFrozenFakeQuantizeOp), q.Arguments(x)).equal(x));
}

TEST(FrozenFakeQuantize, RefusesAQuantizerThatNeverObservedData) {
  Quantizer q = Trained(at::randn({4, 6}), false);
  q.running_min.fill_(INFINITY);
  q.running_max.fill_(-INFINITY);
  try {
    CallOp(Op(kFrozenFakeQuantizeOp), q.Arguments(at::randn({4, 6})));
    ADD_FAILURE() << "ran";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("never seen data"));
  }
}

// ---------------------------------------------------------------- quantized_decomposed

struct Case {
  std::string name;
  json numbers;
  std::map<std::string, at::Tensor> tensors;  // input, output, scale, zero_point
};

std::vector<Case> PythonCases() {
  const std::string path = std::string(RECAL_FIXTURES_DIR) + "/quantized_ops.safetensors";
  auto file = data::MappedFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  auto header = formats::ParseSafetensors((*file)->bytes());
  EXPECT_TRUE(header.ok()) << header.status();
  const std::map<std::string, at::Tensor> tensors = testing::ReadSafetensors(path);
  std::vector<Case> cases;
  for (const auto& [name, numbers] : header->metadata) {
    Case c{name, json::parse(numbers), {}};
    for (const char* part : {"input", "output", "scale", "zero_point"}) {
      auto found = tensors.find(name + "." + part);
      if (found != tensors.end()) c.tensors[part] = found->second;
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

c10::IValue ScalarTypeOf(const std::string& name) {
  return name == "uint8" ? at::kByte : at::kChar;
}

// The arguments of the case's operator, in its schema's order.
std::vector<c10::IValue> Arguments(const Case& c) {
  const json& n = c.numbers;
  const std::string op = n.at("op");
  const at::Tensor& input = c.tensors.at("input");
  std::vector<c10::IValue> args{input};
  if (op.find("per_tensor.tensor") != std::string::npos) {
    args.insert(args.end(), {c.tensors.at("scale"), c.tensors.at("zero_point")});
  } else if (op.find("per_tensor") != std::string::npos) {
    args.insert(args.end(), {n.at("scale").get<double>(), n.at("zero_point").get<int64_t>()});
  } else {
    auto zp = c.tensors.find("zero_point");
    args.insert(args.end(), {c.tensors.at("scale"), zp == c.tensors.end() ? c10::IValue() : c10::IValue(zp->second),
                             n.at("axis").get<int64_t>()});
  }
  args.insert(args.end(), {n.at("quant_min").get<int64_t>(), n.at("quant_max").get<int64_t>(),
                           ScalarTypeOf(n.at("dtype"))});
  if (op.rfind("dequantize", 0) == 0) args.emplace_back();  // out_dtype
  return args;
}

TEST(QuantizedDecomposed, EveryOperatorGivesWhatTorchsPythonOneGives) {
  const std::vector<Case> cases = PythonCases();
  ASSERT_GE(cases.size(), 9u);
  for (const Case& c : cases) {
    const std::string op = c.numbers.at("op");
    const size_t dot = op.find('.');
    const std::string name = "quantized_decomposed::" + op.substr(0, dot);
    const at::Tensor got = CallOp(Op(name.c_str(), dot == std::string::npos ? "" : op.substr(dot + 1).c_str()),
                                  Arguments(c));
    const at::Tensor& want = c.tensors.at("output");
    EXPECT_EQ(got.scalar_type(), want.scalar_type()) << c.name;
    EXPECT_TRUE(got.equal(want)) << c.name << ": differs in "
                                 << (got.to(at::kDouble) != want.to(at::kDouble)).sum().item<int64_t>() << " values";
  }
}

TEST(QuantizedDecomposed, RangesMustFitTheirType) {
  EXPECT_TRUE(CheckQuantRange(0, 255, static_cast<int64_t>(at::kByte)).ok());
  EXPECT_THAT(CheckQuantRange(0, 256, static_cast<int64_t>(at::kByte)).message(), HasSubstr("[0, 255]"));
  EXPECT_THAT(CheckQuantRange(5, 4, static_cast<int64_t>(at::kChar)).message(), HasSubstr("quant_max 4"));
  EXPECT_THAT(CheckQuantRange(0, 1, static_cast<int64_t>(at::kFloat)).message(), HasSubstr("not one Recal quantizes to"));
}

// ---------------------------------------------------------------- programs and runs

const std::string kFx = FixtureModel("qat_fx.exported_train.pt2");
const std::string kConverted = FixtureModel("qat_pt2e_converted.exported_eval.pt2");

TEST(QuantizedPrograms, RefuseAQuantizerWhoseRangeIsEmpty) {
  const std::string path = testing::Edited("qat_range", kFx, [](json& p) {
    for (json& input : NodeWith(Nodes(p), "fused_moving_avg_obs_fake_quant")["inputs"]) {
      if (input["name"] == "quant_min") input["arg"] = {{"as_int", 300}};
    }
  });
  ExpectRefused(path, "quant_min 300 is above quant_max ");  // 255 for activations, 127 for weights
}

TEST(QuantizedPrograms, RefuseAQuantizeOperatorOfAFloatingType) {
  const std::string path = testing::Edited("qat_dtype", kConverted, [](json& p) {
    for (json& input : NodeWith(Nodes(p), "quantize_per_tensor")["inputs"]) {
      if (input["name"] == "dtype") input["arg"] = {{"as_scalar_type", 7}};  // float32
    }
  });
  ExpectRefused(path, "quantized dtype Float is not one Recal quantizes to");
}

TEST(QuantizedPrograms, RefuseAQuantizerArgumentOfTheWrongKind) {
  const std::string path = testing::Edited("qat_kind", kFx, [](json& p) {
    for (json& input : NodeWith(Nodes(p), "fused_moving_avg_obs_fake_quant")["inputs"]) {
      if (input["name"] == "quant_max") input["arg"] = {{"as_string", "255"}};
    }
  });
  ExpectRefused(path, "fused_moving_avg_obs_fake_quant");
}

// `path` run over its family's fixture data, a pass per Options::iterations.
absl::StatusOr<std::unique_ptr<Recalibration>> RunOn(const std::string& path, const std::string& family,
                                                     Options options = {}) {
  auto run = Recalibration::Create(path, options);
  if (!run.ok()) return run.status();
  const std::string data = absl::StrCat("npy:", RECAL_FIXTURES_DIR, "/data/", family, ".npy");
  absl::Status ran = (*run)->RunPasses([&]() -> absl::StatusOr<NextBatchFn> {
    auto pass = data::OpenBatchSource(data, 12);
    if (!pass.ok()) return pass.status();
    return NextBatchFn([source = std::shared_ptr<data::BatchSource>(std::move(*pass))] { return source->Next(); });
  });
  if (!ran.ok()) return ran;
  return run;
}

// The tensor's bytes (its dtype and sizes included).
std::string Bytes(const at::Tensor& t) {
  const at::Tensor c = t.cpu().contiguous();
  return absl::StrCat(std::string(c.dtype().name()), c10::str(c.sizes()),
                      std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size()));
}

TEST(QuantizedPrograms, ObserversDoNotMoveAndTheReportCountsQuantizers) {
  for (const std::string file : {"qat_fx.exported_train.pt2", "qat_fx.traced_train.pt", "qat_pt2e.exported_eval.pt2",
                                 "qat_pt2e_converted.exported_train.pt2"}) {
    const std::string family = file.substr(0, file.find('.'));
    auto run = RunOn(FixtureModel(file), family);
    ASSERT_TRUE(run.ok()) << file << ": " << run.status();
    const v1::RunReport report = (*run)->Report();
    EXPECT_GT(report.quantizers().count(), 0) << file;
    if (family != "qat_pt2e_converted") {
      EXPECT_EQ(report.quantizers().observers_frozen(), report.quantizers().count()) << file;
    }
    // Every buffer of the result but the running statistics is the upload's, byte for byte:
    // observers' ranges, scales, zero points, switches, num_batches_tracked.
    recal::testing::TempDir tmp;
    const std::string out = tmp.File(file);
    ASSERT_TRUE((*run)->WriteModel(out).ok());
    auto uploaded = LoadObservedModel(FixtureModel(file), {c10::kCPU, {}, false});
    auto result = LoadObservedModel(out, {c10::kCPU, {}, false});
    ASSERT_TRUE(uploaded.ok() && result.ok());
    std::map<std::string, at::Tensor> written((*result)->buffers().begin(), (*result)->buffers().end());
    int compared = 0;
    for (const auto& [key, before] : (*uploaded)->buffers()) {
      if (absl::EndsWith(key, "running_mean") || absl::EndsWith(key, "running_var")) continue;
      ASSERT_TRUE(written.count(key)) << file << ": " << key;
      EXPECT_EQ(Bytes(written[key]), Bytes(before)) << file << ": " << key;
      ++compared;
    }
    EXPECT_GT(compared, 10) << file;
  }
}

TEST(QuantizedPrograms, AnObserverInsideTheGraphIsRefusedAtTheFirstBatch) {
  // A node that writes into a quantizer's scale in every forward, as a traced FakeQuantize's
  // observer does.
  const std::string path = testing::Edited("qat_moving", kFx, [](json& p) {
    json& fused = NodeWith(Nodes(p), "fused_moving_avg_obs_fake_quant");
    json scale;
    for (const json& input : fused["inputs"]) {
      if (input["name"] == "scale") scale = input["arg"];
    }
    json node = {{"target", "torch.ops.aten.mul_.Scalar"},
                 {"inputs", json::array({{{"name", "self"}, {"arg", scale}, {"kind", 1}},
                                         {{"name", "other"}, {"arg", {{"as_float", 1.5}}}, {"kind", 1}}})},
                 {"outputs", json::array({{{"as_tensor", {{"name", "moved_scale"}}}}})},
                 {"metadata", json::object()}};
    Nodes(p).insert(Nodes(p).begin(), node);
  });
  auto run = RunOn(path, "qat_fx");
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(run.status().message(), HasSubstr("quantizer state"));
  EXPECT_THAT(run.status().message(), HasSubstr("changed during the forward"));
}

TEST(QuantizedPrograms, IterationsRepeatTheEstimateWithTheStatisticsOfThePassBefore) {
  const auto reference = testing::ReadSafetensors(std::string(RECAL_FIXTURES_DIR) +
                                                  "/ref/qat_fx.population.iterations2.safetensors");
  const auto once = testing::ReadSafetensors(std::string(RECAL_FIXTURES_DIR) + "/ref/qat_fx.population.safetensors");
  ASSERT_FALSE(reference.empty());
  for (const std::string file : {"qat_fx.exported_train.pt2", "qat_fx.traced_eval.pt"}) {
    Options options;
    options.iterations = 2;
    auto run = RunOn(FixtureModel(file), "qat_fx", options);
    ASSERT_TRUE(run.ok()) << run.status();
    recal::testing::TempDir tmp;
    ASSERT_TRUE((*run)->WriteBatchNormBuffers(tmp.File("bn.safetensors")).ok());
    const auto written = testing::ReadSafetensors(tmp.File("bn.safetensors"));
    EXPECT_LE(testing::WorstRelativeError(written, reference), 1e-5) << file;
    // The second pass moved them: the forward reads the running variance.
    EXPECT_GT(testing::WorstRelativeError(written, once), 1e-4) << file;
    const v1::RunReport report = (*run)->Report();
    ASSERT_EQ(report.iterations_size(), 2) << file;
    EXPECT_GT(report.iterations(0).max_var_change(), report.iterations(1).max_var_change()) << file;
    EXPECT_GT(report.iterations(1).max_var_change(), 0) << file;
  }
}

}  // namespace
}  // namespace recal::engine
