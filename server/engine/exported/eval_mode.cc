#include "server/engine/exported/eval_mode.h"

#include <optional>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>


namespace recal::engine::exported {
namespace {

// Who reads each slot of a graph: its steps, by index, and whether the graph returns it.
struct Readers {
  explicit Readers(const Graph& graph) : steps(graph.slots), returned(graph.slots, false) {
    for (size_t i = 0; i < graph.steps.size(); ++i) {
      for (Slot s : SlotsRead(graph.steps[i])) steps[s].push_back(i);
    }
    for (Slot s : graph.results) {
      if (s != kNoSlot) returned[s] = true;
    }
  }
  // The one step that reads `slot`, when exactly one does and the graph does not return it.
  std::optional<size_t> Only(Slot slot) const {
    if (slot == kNoSlot || returned[slot] || steps[slot].size() != 1) return std::nullopt;
    return steps[slot][0];
  }
  std::vector<std::vector<size_t>> steps;
  std::vector<bool> returned;
};

// Operators whose result is a new tensor that shares memory with nothing.
bool MakesFreshTensor(std::string_view target) {
  constexpr std::string_view kFresh[] = {
      "aten::empty",      "aten::new_empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty_strided",
      "aten::empty_permuted", "aten::zeros", "aten::new_zeros", "aten::zeros_like", "aten::ones",
      "aten::new_ones",   "aten::ones_like", "aten::full",       "aten::new_full",      "aten::full_like"};
  for (std::string_view fresh : kFresh) {
    if (fresh == target) return true;
  }
  return false;
}

// The argument named `name` of an operator step, by its schema.
const ArgumentSource* Argument(const Step& step, const char* name) {
  if (!step.op) return nullptr;
  auto index = step.op->schema().argumentIndexWithName(name);
  return index ? &step.arguments[*index] : nullptr;
}

// A number the graph states as a constant: a Python float or int, or such a number where
// the schema has a Tensor (x.div_(0.8)).
std::optional<double> ConstantNumber(const ArgumentSource* a) {
  if (a == nullptr || a->kind != ArgumentSource::Kind::kConstant) return std::nullopt;
  const c10::IValue& v = a->constant;
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isTensor() && v.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) return v.toTensor().item<double>();
  return std::nullopt;
}

bool ReadsSlot(const ArgumentSource* a, Slot slot) {
  return a != nullptr && a->kind == ArgumentSource::Kind::kSlot && a->slot == slot;
}

// The index of the argument the step writes in place, by its schema (bernoulli_.float's
// self, bernoulli.out's out), if any.
std::optional<size_t> WrittenArgument(const Step& step) {
  const auto& arguments = step.op->schema().arguments();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (arguments[i].alias_info() && arguments[i].alias_info()->isWrite()) return i;
  }
  return std::nullopt;
}

// The single slot a step's first return fills (kNoSlot when none or several).
Slot Result(const Step& step) {
  return step.outputs.empty() || step.outputs[0].size() != 1 ? kNoSlot : step.outputs[0][0];
}

// The steps of one proved mask.
struct Mask {
  std::optional<size_t> fresh;  // the tensor the draw fills, when nothing else reads it
  size_t draw = 0;
  std::optional<size_t> division;
  size_t multiply = 0;
  int activation = 0;  // the multiply's argument that eval mode returns
};

// The Bernoulli draw at `draw`, proved to be a mask multiplied into an activation whose
// shape and dtype the product keeps; std::nullopt otherwise.
std::optional<Mask> ProveMask(const Graph& graph, const Readers& readers, size_t draw) {
  const Step& step = graph.steps[draw];
  if ((step.target != "aten::bernoulli" && step.target != "aten::bernoulli_") || !step.op) return std::nullopt;
  const std::optional<double> keep = ConstantNumber(Argument(step, "p"));
  if (!keep) return std::nullopt;  // probabilities in a tensor: not a keep probability the graph states
  Mask mask;
  mask.draw = draw;
  // Drawn in place (bernoulli_), the tensor written must be fresh and read by the draw alone;
  // drawn out of place (bernoulli.p), the tensor read gives only a shape.
  const std::optional<size_t> written = WrittenArgument(step);
  const ArgumentSource& filled = step.arguments[written.value_or(0)];
  if (filled.kind != ArgumentSource::Kind::kSlot) return std::nullopt;
  std::optional<size_t> maker;
  for (size_t i = 0; i < draw; ++i) {
    if (Result(graph.steps[i]) == filled.slot) maker = i;
  }
  const bool fresh = maker && MakesFreshTensor(graph.steps[*maker].target) && readers.Only(filled.slot) == draw;
  if (written && !fresh) return std::nullopt;
  if (fresh) mask.fresh = maker;
  Slot value = Result(step);
  std::optional<size_t> next = readers.Only(value);
  if (!next) return std::nullopt;
  const Step* use = &graph.steps[*next];
  if (use->target == "aten::div" || use->target == "aten::div_") {
    if (*keep <= 0 || !ReadsSlot(Argument(*use, "self"), value) || ConstantNumber(Argument(*use, "other")) != keep ||
        Argument(*use, "rounding_mode") != nullptr) {
      return std::nullopt;
    }
    mask.division = *next;
    value = Result(*use);
    next = readers.Only(value);
    if (!next) return std::nullopt;
    use = &graph.steps[*next];
  }
  if (use->target != "aten::mul" || use->writes_argument) return std::nullopt;
  const ArgumentSource* self = Argument(*use, "self");
  const ArgumentSource* other = Argument(*use, "other");
  const bool mask_is_other = ReadsSlot(other, value);
  if (!mask_is_other && !ReadsSlot(self, value)) return std::nullopt;
  const ArgumentSource* x = mask_is_other ? self : other;
  if (x == nullptr || x->kind != ArgumentSource::Kind::kSlot) return std::nullopt;
  // Eval returns x itself: exact only when the product has x's shape and dtype (the mask
  // broadcasts into x, never x into the mask).
  const std::string& x_type = graph.value_types[x->slot];
  const Slot product = Result(*use);
  if (x_type.empty() || product == kNoSlot || graph.value_types[product] != x_type) return std::nullopt;
  mask.multiply = *next;
  mask.activation = mask_is_other ? 0 : 1;
  return mask;
}

}  // namespace

int ReplaceRandomMasks(Graph& graph) {
  int replaced = 0;
  const Readers readers(graph);
  for (size_t i = 0; i < graph.steps.size(); ++i) {
    if (graph.steps[i].eliminated) continue;
    const std::optional<Mask> mask = ProveMask(graph, readers, i);
    if (!mask) continue;
    graph.steps[mask->draw].eliminated = true;
    if (mask->fresh) graph.steps[*mask->fresh].eliminated = true;
    if (mask->division) graph.steps[*mask->division].eliminated = true;
    graph.steps[mask->multiply].returns_argument = mask->activation;
    ++replaced;
  }
  for (Step& step : graph.steps) {
    for (Graph& nested : step.subgraphs) replaced += ReplaceRandomMasks(nested);
  }
  return replaced;
}

}  // namespace recal::engine::exported
