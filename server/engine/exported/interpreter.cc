#include "server/engine/exported/interpreter.h"

#include <cmath>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "server/engine/collector.h"

namespace recal::engine::exported {
namespace {

using Stack = std::vector<c10::IValue>;

c10::IValue ListOf(const ArgumentSource& source, const std::vector<c10::IValue>& values) {
  auto element = [&](const std::pair<Slot, c10::IValue>& e) -> const c10::IValue& {
    return e.first == kNoSlot ? e.second : values[e.first];
  };
  const c10::TypePtr type = source.list_type->castRaw<c10::ListType>()->getElementType();
  switch (type->kind()) {
    case c10::TypeKind::TensorType: {
      c10::List<at::Tensor> list;
      for (const auto& e : source.elements) list.push_back(element(e).toTensor());
      return list;
    }
    case c10::TypeKind::OptionalType: {
      c10::List<std::optional<at::Tensor>> list;
      for (const auto& e : source.elements) {
        const c10::IValue& v = element(e);
        list.push_back(v.isNone() ? std::nullopt : std::optional<at::Tensor>(v.toTensor()));
      }
      return list;
    }
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType: {
      std::vector<double> list;
      for (const auto& e : source.elements) list.push_back(element(e).toScalar().toDouble());
      return list;
    }
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType: {
      c10::List<bool> list;
      for (const auto& e : source.elements) list.push_back(element(e).toBool());
      return list;
    }
    default: {
      std::vector<int64_t> list;
      for (const auto& e : source.elements) list.push_back(element(e).toInt());
      return list;
    }
  }
}

c10::IValue Gather(const ArgumentSource& source, const std::vector<c10::IValue>& values) {
  switch (source.kind) {
    case ArgumentSource::Kind::kConstant: return source.constant;
    case ArgumentSource::Kind::kSlot: return values[source.slot];
    case ArgumentSource::Kind::kList: return ListOf(source, values);
  }
  return {};
}

int64_t FloorDiv(int64_t a, int64_t b) {
  TORCH_CHECK(b != 0, "integer division by zero in a shape computation");
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t Mod(int64_t a, int64_t b) {
  TORCH_CHECK(b != 0, "integer modulo by zero in a shape computation");
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// Python's semantics on the ints, floats and bools of symbolic shapes.
c10::IValue Symbolic(SymbolicOp op, const Stack& args) {
  TORCH_CHECK(!args.empty(), "a shape computation without arguments");
  bool ints = true;
  for (const auto& a : args) ints &= a.isInt() || a.isBool();
  auto i = [&](size_t k) { return args.at(k).isBool() ? int64_t{args[k].toBool()} : args.at(k).toInt(); };
  auto d = [&](size_t k) { return args.at(k).isDouble() ? args[k].toDouble() : static_cast<double>(i(k)); };
  switch (op) {
    case SymbolicOp::kAdd: return ints ? c10::IValue(i(0) + i(1)) : c10::IValue(d(0) + d(1));
    case SymbolicOp::kSub: return ints ? c10::IValue(i(0) - i(1)) : c10::IValue(d(0) - d(1));
    case SymbolicOp::kMul: return ints ? c10::IValue(i(0) * i(1)) : c10::IValue(d(0) * d(1));
    case SymbolicOp::kFloorDiv: return ints ? c10::IValue(FloorDiv(i(0), i(1))) : c10::IValue(std::floor(d(0) / d(1)));
    case SymbolicOp::kTrueDiv: return c10::IValue(d(0) / d(1));
    case SymbolicOp::kMod: return ints ? c10::IValue(Mod(i(0), i(1))) : c10::IValue(d(0) - std::floor(d(0) / d(1)) * d(1));
    case SymbolicOp::kNeg: return ints ? c10::IValue(-i(0)) : c10::IValue(-d(0));
    case SymbolicOp::kEq: return ints ? i(0) == i(1) : d(0) == d(1);
    case SymbolicOp::kNe: return ints ? i(0) != i(1) : d(0) != d(1);
    case SymbolicOp::kLt: return ints ? i(0) < i(1) : d(0) < d(1);
    case SymbolicOp::kLe: return ints ? i(0) <= i(1) : d(0) <= d(1);
    case SymbolicOp::kGt: return ints ? i(0) > i(1) : d(0) > d(1);
    case SymbolicOp::kGe: return ints ? i(0) >= i(1) : d(0) >= d(1);
    case SymbolicOp::kAnd: return args.at(0).toBool() && args.at(1).toBool();
    case SymbolicOp::kOr: return args.at(0).toBool() || args.at(1).toBool();
    case SymbolicOp::kNot: return !args.at(0).toBool();
    case SymbolicOp::kMax: return ints ? c10::IValue(std::max(i(0), i(1))) : c10::IValue(std::max(d(0), d(1)));
    case SymbolicOp::kMin: return ints ? c10::IValue(std::min(i(0), i(1))) : c10::IValue(std::min(d(0), d(1)));
    case SymbolicOp::kToFloat: return d(0);
    case SymbolicOp::kToInt: return static_cast<int64_t>(d(0));
    case SymbolicOp::kCeil: return static_cast<int64_t>(std::ceil(d(0)));
    case SymbolicOp::kFloor: return static_cast<int64_t>(std::floor(d(0)));
    case SymbolicOp::kNone: break;
  }
  TORCH_CHECK(false, "unknown shape computation");
}

std::optional<at::Tensor> OptionalTensor(const c10::IValue& v) {
  return v.isNone() ? std::nullopt : std::optional<at::Tensor>(v.toTensor());
}

// The BatchNorm of `step` through the collector; its returns replace `stack`. False when its
// statistics are not tensors (no running statistics): then it runs as it is.
bool ObserveBatchNorm(const Step& step, Stack& stack, Collector* collector) {
  const c10::FunctionSchema& schema = step.op->schema();
  auto at = [&](const char* name) -> const c10::IValue& { return stack[*schema.argumentIndexWithName(name)]; };
  const c10::IValue& running_mean = at("running_mean");
  const c10::IValue& running_var = at("running_var");
  if (!running_mean.isTensor() || !running_var.isTensor()) return false;
  const auto training_index = schema.argumentIndexWithName("training");
  const bool training = training_index ? stack[*training_index].toBool() : step.batch_norm == BatchNormForm::kWithUpdate;
  const at::Tensor input = at("input").toTensor();
  at::Tensor out = collector->Observe(input, OptionalTensor(at("weight")), OptionalTensor(at("bias")),
                                      running_mean.toTensor(), running_var.toTensor(), training,
                                      at("momentum").toScalar().toDouble(), at("eps").toScalar().toDouble(),
                                      /*cudnn_enabled=*/false);
  // The other returns (saved statistics for a backward, a reserve) are read by nothing in a
  // forward; the functional form's new running statistics are the graph's buffer updates,
  // which the engine makes itself at the end.
  const at::Tensor unused = at::empty({0}, input.options());
  Stack returns{std::move(out)};
  for (size_t k = 1; k < schema.returns().size(); ++k) {
    if (step.batch_norm == BatchNormForm::kLegitFunctional && k == 3) returns.push_back(running_mean);
    else if (step.batch_norm == BatchNormForm::kLegitFunctional && k == 4) returns.push_back(running_var);
    else returns.push_back(unused);
  }
  stack = std::move(returns);
  return true;
}

// The mask's expected value in place of a Bernoulli draw: what eval mode computes for the
// inverted dropout and stochastic depth a train-mode export bakes in (x * mask / keep
// becomes x * keep / keep, which is x exactly).
void ExpectedBernoulli(const Step& step, Stack& stack) {
  const at::Tensor self = stack.at(0).toTensor();
  const auto p_index = step.op->schema().argumentIndexWithName("p");
  const bool in_place = step.target.back() == '_';
  at::Tensor out = in_place ? self : at::empty_like(self);
  if (!p_index) {
    if (!in_place) out.copy_(self);  // bernoulli(self): self holds the probabilities
  } else if (stack[*p_index].isTensor()) {
    out.copy_(stack[*p_index].toTensor());
  } else {
    out.fill_(stack[*p_index].toScalar());
  }
  stack = {out};
}

void StoreOutputs(const Step& step, Stack& stack, std::vector<c10::IValue>& values) {
  for (size_t j = 0; j < step.outputs.size(); ++j) {
    const std::vector<Slot>& slots = step.outputs[j];
    if (j >= stack.size()) {  // an operator returning nothing, serialized with one None output
      for (Slot s : slots) TORCH_CHECK(s == kNoSlot, "returned ", stack.size(), " values, the graph reads more");
      continue;
    }
    if (stack[j].isList()) {
      c10::List<c10::IValue> list = stack[j].toList();
      TORCH_CHECK(list.size() == slots.size(), "returned ", list.size(), " values, the graph expects ", slots.size());
      for (size_t k = 0; k < slots.size(); ++k) {
        if (slots[k] != kNoSlot) values[slots[k]] = list.get(k);
      }
    } else if (slots.size() == 1 && slots[0] != kNoSlot) {
      values[slots[0]] = std::move(stack[j]);
    }
  }
}

}  // namespace

void RunStep(const Step& step, std::vector<c10::IValue>& values, Collector* collector) {
  Stack stack;
  stack.reserve(step.arguments.size());
  for (const ArgumentSource& source : step.arguments) stack.push_back(Gather(source, values));
  try {
    if (step.symbolic != SymbolicOp::kNone) {
      stack = {Symbolic(step.symbolic, stack)};
    } else if (step.expected_value) {
      ExpectedBernoulli(step, stack);
    } else if (step.batch_norm == BatchNormForm::kNone || collector == nullptr ||
               !ObserveBatchNorm(step, stack, collector)) {
      step.op->callBoxed(stack);
    }
    StoreOutputs(step, stack, values);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "node ", step.name, " (", step.target, "): ", e.what_without_backtrace());
  }
}

std::vector<Slot> SlotsRead(const Step& step) {
  std::vector<Slot> read;
  for (const ArgumentSource& source : step.arguments) {
    if (source.kind == ArgumentSource::Kind::kSlot) read.push_back(source.slot);
    for (const auto& [slot, constant] : source.elements) {
      if (slot != kNoSlot) read.push_back(slot);
    }
  }
  return read;
}

}  // namespace recal::engine::exported
