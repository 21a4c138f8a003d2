#include "server/engine/exported/quantizers.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace recal::engine::exported {
namespace {

// The constant integer argument `name` of `step` (none when the schema has no such argument);
// INVALID_ARGUMENT when it is anything else (a value the graph computes, a string).
absl::StatusOr<std::optional<int64_t>> ConstantInt(const Step& step, const char* name) {
  const std::optional<int> at = step.op->schema().argumentIndexWithName(name);
  if (!at) return std::optional<int64_t>();
  const ArgumentSource& source = step.arguments[*at];
  if (source.kind != ArgumentSource::Kind::kConstant || !source.constant.isInt()) {
    return absl::InvalidArgumentError(
        absl::StrCat("its ", name, " is not an integer the program states (a quantizer takes its range and type as "
                     "numbers, not values the graph computes)"));
  }
  return std::optional<int64_t>(source.constant.toInt());
}

absl::Status CheckOrdered(int64_t quant_min, int64_t quant_max) {
  if (quant_min <= quant_max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("quant_min ", quant_min, " is above quant_max ", quant_max, ": no value can be quantized"));
}

absl::Status CheckArguments(const Step& step) {
  RECAL_ASSIGN_OR_RETURN(std::optional<int64_t> quant_min, ConstantInt(step, "quant_min"));
  RECAL_ASSIGN_OR_RETURN(std::optional<int64_t> quant_max, ConstantInt(step, "quant_max"));
  if (!quant_min || !quant_max) return absl::InvalidArgumentError("no quant_min / quant_max");
  if (step.quantizer == QuantizerKind::kObserving || step.quantizer == QuantizerKind::kFakeQuantize) {
    return CheckOrdered(*quant_min, *quant_max);
  }
  RECAL_ASSIGN_OR_RETURN(std::optional<int64_t> dtype, ConstantInt(step, "dtype"));
  if (!dtype) return absl::InvalidArgumentError("no dtype");
  return CheckQuantRange(*quant_min, *quant_max, *dtype);
}

}  // namespace

absl::Status PlanQuantizer(Step& step) {
  step.quantizer = QuantizerKindOf(step.target);
  if (step.quantizer == QuantizerKind::kNone) return absl::OkStatus();
  RECAL_RETURN_IF_ERROR(CheckArguments(step));
  if (step.quantizer != QuantizerKind::kObserving) return absl::OkStatus();
  // Registered by server/engine/quantizers.cc, with the same arguments in the same order.
  step.op = c10::Dispatcher::singleton().findSchema({kFrozenFakeQuantizeOp, ""});
  if (!step.op) return absl::InternalError(absl::StrCat(kFrozenFakeQuantizeOp, " is not registered"));
  step.writes_argument = false;
  return absl::OkStatus();
}

QuantizerCounts CountQuantizers(const Graph& graph) {
  QuantizerCounts counts;
  ForEachStep(graph, [&](const Step& step) {
    if (step.quantizer == QuantizerKind::kNone || step.quantizer == QuantizerKind::kDequantize) return;
    ++counts.quantizers;
    if (step.quantizer == QuantizerKind::kObserving) ++counts.observers_frozen;
  });
  return counts;
}

std::vector<Slot> QuantizerParameterSlots(const Step& step) {
  std::vector<Slot> slots;
  if (step.quantizer == QuantizerKind::kNone) return slots;
  for (size_t k = 1; k < step.arguments.size(); ++k) {
    if (step.arguments[k].kind == ArgumentSource::Kind::kSlot) slots.push_back(step.arguments[k].slot);
  }
  return slots;
}

}  // namespace recal::engine::exported
