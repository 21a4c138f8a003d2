#include "server/engine/exported/interpreter.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "server/engine/autocast_scope.h"
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

// Shape arithmetic on values an uploaded graph chooses: overflow is an error, never
// undefined behaviour.
int64_t Add(int64_t a, int64_t b) {
  int64_t r;
  TORCH_CHECK(!__builtin_add_overflow(a, b, &r), "integer overflow in a shape computation");
  return r;
}

int64_t Sub(int64_t a, int64_t b) {
  int64_t r;
  TORCH_CHECK(!__builtin_sub_overflow(a, b, &r), "integer overflow in a shape computation");
  return r;
}

int64_t Mul(int64_t a, int64_t b) {
  int64_t r;
  TORCH_CHECK(!__builtin_mul_overflow(a, b, &r), "integer overflow in a shape computation");
  return r;
}

// A float as an integer (truncated), refused when it is not a finite int64.
int64_t ToInt(double v) {
  TORCH_CHECK(std::isfinite(v) && v >= -9.2233720368547758e18 && v < 9.2233720368547758e18,
              "a shape computation made ", v, ", not an integer");
  return static_cast<int64_t>(v);
}

int64_t FloorDiv(int64_t a, int64_t b) {
  TORCH_CHECK(b != 0, "integer division by zero in a shape computation");
  TORCH_CHECK(!(a == INT64_MIN && b == -1), "integer overflow in a shape computation");
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t Mod(int64_t a, int64_t b) {
  TORCH_CHECK(b != 0, "integer modulo by zero in a shape computation");
  if (b == -1) return 0;  // INT64_MIN % -1 overflows
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
    case SymbolicOp::kAdd: return ints ? c10::IValue(Add(i(0), i(1))) : c10::IValue(d(0) + d(1));
    case SymbolicOp::kSub: return ints ? c10::IValue(Sub(i(0), i(1))) : c10::IValue(d(0) - d(1));
    case SymbolicOp::kMul: return ints ? c10::IValue(Mul(i(0), i(1))) : c10::IValue(d(0) * d(1));
    case SymbolicOp::kFloorDiv: return ints ? c10::IValue(FloorDiv(i(0), i(1))) : c10::IValue(std::floor(d(0) / d(1)));
    case SymbolicOp::kTrueDiv: return c10::IValue(d(0) / d(1));
    case SymbolicOp::kMod: return ints ? c10::IValue(Mod(i(0), i(1))) : c10::IValue(d(0) - std::floor(d(0) / d(1)) * d(1));
    case SymbolicOp::kNeg: return ints ? c10::IValue(Sub(0, i(0))) : c10::IValue(-d(0));
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
    case SymbolicOp::kToInt: return ToInt(d(0));
    case SymbolicOp::kCeil: return ToInt(std::ceil(d(0)));
    case SymbolicOp::kFloor: return ToInt(std::floor(d(0)));
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
  const BatchNormArguments& args = step.batch_norm_arguments;
  const c10::IValue& running_mean = stack[args.running_mean];
  const c10::IValue& running_var = stack[args.running_var];
  if (!running_mean.isTensor() || !running_var.isTensor()) return false;
  const bool training = args.training ? stack[*args.training].toBool() : step.batch_norm == BatchNormForm::kWithUpdate;
  const at::Tensor input = stack[args.input].toTensor();
  at::Tensor out = collector->Observe(input, OptionalTensor(stack[args.weight]), OptionalTensor(stack[args.bias]),
                                      running_mean.toTensor(), running_var.toTensor(), training,
                                      stack[args.momentum].toScalar().toDouble(), stack[args.eps].toScalar().toDouble(),
                                      /*cudnn_enabled=*/false);
  // The other returns (saved statistics for a backward, a reserve) are read by nothing in a
  // forward; the functional form's new running statistics are the graph's buffer updates,
  // which the engine makes itself at the end.
  const at::Tensor unused = at::empty({0}, input.options());
  Stack returns{std::move(out)};
  for (size_t k = 1; k < step.op->schema().returns().size(); ++k) {
    if (step.batch_norm == BatchNormForm::kLegitFunctional && k == 3) returns.push_back(running_mean);
    else if (step.batch_norm == BatchNormForm::kLegitFunctional && k == 4) returns.push_back(running_var);
    else returns.push_back(unused);
  }
  stack = std::move(returns);
  return true;
}

// `graph` called with `operands` in its placeholders: what it returns.
Stack CallGraph(const Graph& graph, Stack operands, Collector* collector) {
  std::vector<c10::IValue> values(graph.slots);
  for (size_t i = 0; i < graph.placeholders.size(); ++i) values[graph.placeholders[i]] = std::move(operands[i]);
  for (const Step& step : graph.steps) {
    if (!step.eliminated) RunStep(step, values, collector);
  }
  Stack results;
  for (Slot s : graph.results) results.push_back(s == kNoSlot ? c10::IValue() : values[s]);
  return results;
}

// torch.cond's predicate: a boolean, or a tensor of one element.
bool Predicate(const c10::IValue& pred) {
  if (pred.isBool()) return pred.toBool();
  const at::Tensor t = pred.toTensor();
  TORCH_CHECK(t.numel() == 1, "torch.cond's predicate has ", t.numel(), " elements, not one");
  return t.item<bool>();
}

// A region's graph run as the eager model runs it. Grad mode is left as it is: it changes
// what a backward could do, never a forward's values, and the engine's forward keeps none.
void RunHigherOrder(const Step& step, Stack& stack, Collector* collector) {
  Stack operands(stack.begin() + static_cast<std::ptrdiff_t>(step.operands_begin), stack.end());
  switch (step.higher_order) {
    case HigherOrder::kAutocast: {
      const c10::DeviceType device = stack[0].toStringRef() == "cuda" ? c10::kCUDA : c10::kCPU;
      const std::optional<c10::ScalarType> dtype =
          stack[1].isNone() ? std::nullopt : std::optional<c10::ScalarType>(static_cast<c10::ScalarType>(stack[1].toInt()));
      const std::optional<bool> cache = stack[3].isNone() ? std::nullopt : std::optional<bool>(stack[3].toBool());
      AutocastScope region(device, stack[2].toBool(), dtype, cache);
      stack = CallGraph(step.subgraphs[0], std::move(operands), collector);
      return;
    }
    case HigherOrder::kCond:
      stack = CallGraph(step.subgraphs[Predicate(stack[0]) ? 0 : 1], std::move(operands), collector);
      return;
    default:
      stack = CallGraph(step.subgraphs[0], std::move(operands), collector);
  }
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
  if (step.returns_argument) {
    Stack returned{Gather(step.arguments[*step.returns_argument], values)};
    StoreOutputs(step, returned, values);
    return;
  }
  Stack stack;
  stack.reserve(step.arguments.size());
  for (const ArgumentSource& source : step.arguments) stack.push_back(Gather(source, values));
  try {
    if (step.symbolic != SymbolicOp::kNone) {
      stack = {Symbolic(step.symbolic, stack)};
    } else if (step.higher_order != HigherOrder::kNone) {
      RunHigherOrder(step, stack, collector);
    } else if (step.batch_norm == BatchNormForm::kNone || collector == nullptr ||
               !ObserveBatchNorm(step, stack, collector)) {
      step.op->callBoxed(stack);
    }
    StoreOutputs(step, stack, values);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "node ", step.name, " (", step.target, "): ", e.what_without_backtrace());
  }
}

}  // namespace recal::engine::exported
