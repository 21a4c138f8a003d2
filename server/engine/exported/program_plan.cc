#include "server/engine/exported/program_plan.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>

#include <ATen/ScalarOps.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "server/engine/dropout_ops.h"
#include "server/engine/exported/quantizers.h"
#include "server/engine/exported/serialized_types.h"

namespace recal::engine::exported {
namespace {

using nlohmann::json;

// Operators that only exported graphs hold (TorchScript has no equivalent node), beside the
// allowlist TorchScript graphs are checked against: shape queries and assertions on
// symbolic sizes, and the decomposed forms of BatchNorm, dropout and .to(). The quantize /
// dequantize operators of converted pt2e programs (kQuantizedDecomposedOps) are allowed too.
constexpr const char* kExportOnlyOps[] = {
    "aten::sym_size",          "aten::sym_numel",          "aten::sym_stride",
    "aten::sym_storage_offset", "aten::_assert_tensor_metadata", "aten::_assert_scalar",
    "aten::sym_constrain_range", "aten::sym_constrain_range_for_size", "aten::native_batch_norm",
    "aten::_native_batch_norm_legit", "aten::_native_batch_norm_legit_functional",
    "aten::_native_batch_norm_legit_no_training", "aten::_batch_norm_with_update",
    "aten::_batch_norm_no_update", "aten::native_dropout", "aten::empty_permuted", "aten::_to_copy"};

constexpr std::pair<const char*, BatchNormForm> kBatchNormForms[] = {
    {"batch_norm", BatchNormForm::kBatchNorm},
    {"native_batch_norm", BatchNormForm::kNative},
    {"_native_batch_norm_legit", BatchNormForm::kLegit},
    {"_native_batch_norm_legit_functional", BatchNormForm::kLegitFunctional},
    {"_native_batch_norm_legit_no_training", BatchNormForm::kLegitNoTraining},
    {"_batch_norm_with_update", BatchNormForm::kWithUpdate},
    {"_batch_norm_no_update", BatchNormForm::kNoUpdate}};

constexpr std::pair<const char*, SymbolicOp> kSymbolicOps[] = {
    {"_operator.add", SymbolicOp::kAdd},      {"_operator.sub", SymbolicOp::kSub},
    {"_operator.mul", SymbolicOp::kMul},      {"_operator.floordiv", SymbolicOp::kFloorDiv},
    {"_operator.truediv", SymbolicOp::kTrueDiv}, {"_operator.mod", SymbolicOp::kMod},
    {"_operator.neg", SymbolicOp::kNeg},      {"_operator.eq", SymbolicOp::kEq},
    {"_operator.ne", SymbolicOp::kNe},        {"_operator.lt", SymbolicOp::kLt},
    {"_operator.le", SymbolicOp::kLe},        {"_operator.gt", SymbolicOp::kGt},
    {"_operator.ge", SymbolicOp::kGe},        {"_operator.and_", SymbolicOp::kAnd},
    {"_operator.or_", SymbolicOp::kOr},       {"_operator.not_", SymbolicOp::kNot},
    {"torch.sym_not", SymbolicOp::kNot},      {"torch.sym_max", SymbolicOp::kMax},
    {"torch.sym_min", SymbolicOp::kMin},      {"torch.sym_float", SymbolicOp::kToFloat},
    {"torch.sym_int", SymbolicOp::kToInt},    {"math.ceil", SymbolicOp::kCeil},
    {"math.floor", SymbolicOp::kFloor}};

absl::Status NodeError(const json& node, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("exported program: node '", node.value("name", std::string("?")),
                                                 "' (", node.value("target", std::string("?")), "): ", what));
}

// The union member of a serialized Argument ({"as_tensor": {...}}): its key and value.
absl::StatusOr<std::pair<std::string, const json*>> Member(const json& arg) {
  if (!arg.is_object() || arg.size() != 1) return absl::InvalidArgumentError("malformed argument");
  return std::make_pair(arg.begin().key(), &arg.begin().value());
}

bool IsTensor(const c10::TypePtr& type) { return type->kind() == c10::TypeKind::TensorType; }

// Value names to slots, given as the graph defines them.
class Slots {
 public:
  Slot Define(const std::string& name) {
    auto [it, added] = slots_.emplace(name, count_);
    if (added) ++count_;
    return it->second;
  }
  absl::StatusOr<Slot> Use(const std::string& name) const {
    auto it = slots_.find(name);
    if (it == slots_.end()) return absl::InvalidArgumentError(absl::StrCat("uses '", name, "' before it is made"));
    return it->second;
  }
  int count() const { return count_; }
  const std::unordered_map<std::string, Slot>& by_name() const { return slots_; }

 private:
  std::unordered_map<std::string, Slot> slots_;
  int count_ = 0;
};

ArgumentSource Constant(c10::IValue value) {
  ArgumentSource source;
  source.constant = std::move(value);
  return source;
}

// A scalar member (as_int, as_float, as_bool, as_sym_*) as the schema's `type` wants it.
absl::StatusOr<ArgumentSource> Scalar(const std::string& key, const json& value, const c10::TypePtr& type,
                                      const Slots& slots) {
  const c10::TypeKind kind = type->kind();
  if (absl::StartsWith(key, "as_sym_")) {
    RECAL_ASSIGN_OR_RETURN(auto member, Member(value));
    if (member.first == "as_name") {
      ArgumentSource source;
      source.kind = ArgumentSource::Kind::kSlot;
      RECAL_ASSIGN_OR_RETURN(source.slot, slots.Use(member.second->get<std::string>()));
      return source;
    }
    return Scalar(member.first, *member.second, type, slots);
  }
  if (key == "as_int") {
    const int64_t v = SchemaInt(value);
    if (kind == c10::TypeKind::FloatType || kind == c10::TypeKind::SymFloatType) return Constant(static_cast<double>(v));
    return Constant(v);
  }
  if (key == "as_float") return Constant(value.get<double>());
  if (key == "as_bool") return Constant(value.get<bool>());
  return absl::InvalidArgumentError(absl::StrCat("unexpected ", key));
}

// A list member (as_ints, as_tensors, as_sym_ints, ...) of the schema's list `type`.
absl::StatusOr<ArgumentSource> List(const std::string& key, const json& value, const c10::TypePtr& type,
                                    const Slots& slots) {
  auto list_type = type->cast<c10::ListType>();
  if (!list_type || !value.is_array()) return absl::InvalidArgumentError(absl::StrCat(key, " where the schema has ", type->str()));
  const c10::TypePtr element = list_type->getElementType();
  ArgumentSource source;
  source.kind = ArgumentSource::Kind::kList;
  source.list_type = type;
  bool all_constant = true;
  for (const json& item : value) {
    if (key == "as_tensors" || (key == "as_optional_tensors" && item.contains("as_tensor"))) {
      const json& tensor = key == "as_tensors" ? item : item.at("as_tensor");
      RECAL_ASSIGN_OR_RETURN(Slot slot, slots.Use(tensor.at("name").get<std::string>()));
      source.elements.emplace_back(slot, c10::IValue());
      all_constant = false;
    } else if (key == "as_optional_tensors") {
      source.elements.emplace_back(kNoSlot, c10::IValue());
    } else {
      const std::string scalar = key == "as_ints" ? "as_int" : key == "as_floats" ? "as_float"
                                 : key == "as_bools" ? "as_bool" : key.substr(0, key.size() - 1);
      RECAL_ASSIGN_OR_RETURN(ArgumentSource one, Scalar(scalar, item, element, slots));
      all_constant &= one.kind == ArgumentSource::Kind::kConstant;
      source.elements.emplace_back(one.slot, std::move(one.constant));
    }
  }
  if (!all_constant || IsTensor(element)) return source;
  // Built once here rather than on every call.
  std::vector<c10::IValue> items;
  for (auto& [slot, constant] : source.elements) items.push_back(constant);
  if (element->kind() == c10::TypeKind::FloatType) {
    std::vector<double> v;
    for (const auto& i : items) v.push_back(i.toDouble());
    return Constant(v);
  }
  if (element->kind() == c10::TypeKind::BoolType) {
    c10::List<bool> v;
    for (const auto& i : items) v.push_back(i.toBool());
    return Constant(v);
  }
  std::vector<int64_t> v;
  for (const auto& i : items) {
    if (!i.isInt()) return absl::InvalidArgumentError(absl::StrCat(key, " holds a non-integer"));
    v.push_back(i.toInt());
  }
  return Constant(v);
}

// One serialized argument as the schema argument `expected` takes it.
absl::StatusOr<ArgumentSource> Convert(const json& arg, const c10::Argument& expected, const Slots& slots,
                                       const c10::Device& device) {
  RECAL_ASSIGN_OR_RETURN(auto member, Member(arg));
  const auto& [key, value] = member;
  c10::TypePtr type = expected.real_type();
  if (auto optional = type->cast<c10::OptionalType>()) {
    if (key == "as_none") return Constant(c10::IValue());
    type = optional->getElementType();
  }
  const bool tensor_key = key == "as_tensor" || key == "as_optional_tensor";
  if (IsTensor(type) && (key == "as_int" || key == "as_float" || key == "as_bool")) {
    // A Python number where the schema has a Tensor (x.add_(1)): a wrapped number, which
    // type promotion treats as the scalar it was.
    at::Tensor number = key == "as_int"     ? at::scalar_to_tensor(SchemaInt(*value))
                        : key == "as_float" ? at::scalar_to_tensor(value->get<double>())
                                            : at::scalar_to_tensor(value->get<bool>());
    number.unsafeGetTensorImpl()->set_wrapped_number(true);
    return Constant(number);
  }
  if (tensor_key != IsTensor(type)) {
    return absl::InvalidArgumentError(absl::StrCat("argument '", expected.name(), "' is ", key,
                                                   " where the schema has ", expected.type()->str()));
  }
  if (key == "as_optional_tensor") {
    if (value->contains("as_none")) return Constant(c10::IValue());
    return Convert(json{{"as_tensor", value->at("as_tensor")}}, expected, slots, device);
  }
  if (key == "as_tensor") {
    ArgumentSource source;
    source.kind = ArgumentSource::Kind::kSlot;
    RECAL_ASSIGN_OR_RETURN(source.slot, slots.Use(value->at("name").get<std::string>()));
    return source;
  }
  if (key == "as_none") return Constant(c10::IValue());
  if (key == "as_string") return Constant(value->get<std::string>());
  if (key == "as_scalar_type") {
    RECAL_ASSIGN_OR_RETURN(c10::ScalarType t, ScalarTypeOf(SchemaInt(*value)));
    return Constant(static_cast<int64_t>(t));
  }
  if (key == "as_layout") {
    RECAL_ASSIGN_OR_RETURN(c10::Layout l, LayoutOf(SchemaInt(*value)));
    return Constant(static_cast<int64_t>(l));
  }
  if (key == "as_memory_format") {
    RECAL_ASSIGN_OR_RETURN(c10::MemoryFormat f, MemoryFormatOf(SchemaInt(*value)));
    return Constant(static_cast<int64_t>(f));
  }
  if (key == "as_device") return Constant(device);  // the whole program runs on one device
  if (key == "as_complex") return Constant(c10::complex<double>(value->at("real").get<double>(), value->at("imag").get<double>()));
  if (key == "as_strings") return Constant(value->get<std::vector<std::string>>());
  if (key == "as_tensors" || key == "as_optional_tensors" || key == "as_ints" || key == "as_floats" ||
      key == "as_bools" || key == "as_sym_ints" || key == "as_sym_floats" || key == "as_sym_bools") {
    return List(key, *value, type, slots);
  }
  if (key == "as_int" || key == "as_float" || key == "as_bool" || key == "as_sym_int" || key == "as_sym_float" ||
      key == "as_sym_bool") {
    return Scalar(key, *value, type, slots);
  }
  return absl::InvalidArgumentError(absl::StrCat("argument '", expected.name(), "' is ", key,
                                                 ", which Recal does not run"));
}

// The slots one serialized output fills.
absl::StatusOr<std::vector<Slot>> OutputSlots(const json& output, Slots& slots) {
  RECAL_ASSIGN_OR_RETURN(auto member, Member(output));
  const auto& [key, value] = member;
  if (key == "as_tensor") return std::vector<Slot>{slots.Define(value->at("name").get<std::string>())};
  if (key == "as_tensors" || key == "as_optional_tensors") {
    std::vector<Slot> out;
    for (const json& item : *value) {
      const json* tensor = key == "as_tensors" ? &item : item.contains("as_tensor") ? &item.at("as_tensor") : nullptr;
      out.push_back(tensor ? slots.Define(tensor->at("name").get<std::string>()) : kNoSlot);
    }
    return out;
  }
  if (absl::StartsWith(key, "as_sym_") && value->is_object() && value->contains("as_name")) {
    return std::vector<Slot>{slots.Define(value->at("as_name").get<std::string>())};
  }
  return std::vector<Slot>{kNoSlot};  // a constant or None the graph never reads
}

absl::Status PlanOperator(const json& node, const std::string& ns, const std::string& name,
                          const std::string& overload, Slots& slots, const c10::Device& device, Step& step) {
  step.target = absl::StrCat(ns, "::", name);
  step.op = c10::Dispatcher::singleton().findSchema({step.target, overload == "default" ? "" : overload});
  if (!step.op) return NodeError(node, "no such operator in this LibTorch");
  const c10::FunctionSchema& schema = step.op->schema();
  std::map<std::string, const json*> given;
  for (const json& input : node.at("inputs")) given[input.at("name").get<std::string>()] = &input.at("arg");
  for (const c10::Argument& expected : schema.arguments()) {
    step.writes_argument |= expected.alias_info() && expected.alias_info()->isWrite();
    auto found = given.find(expected.name());
    if (found == given.end()) {
      if (!expected.default_value()) return NodeError(node, absl::StrCat("argument '", expected.name(), "' is missing"));
      step.arguments.push_back(Constant(*expected.default_value()));
    } else {
      auto source = Convert(*found->second, expected, slots, device);
      if (!source.ok()) return NodeError(node, source.status().message());
      step.arguments.push_back(std::move(*source));
      given.erase(found);
    }
    // A factory operator that names no device (zeros, arange, empty_strided) allocates on
    // the host by default: the whole program runs on the job's device.
    ArgumentSource& made = step.arguments.back();
    if (expected.name() == "device" && made.kind == ArgumentSource::Kind::kConstant && made.constant.isNone()) {
      made.constant = device;
    }
  }
  if (!given.empty()) return NodeError(node, absl::StrCat("argument '", given.begin()->first, "' is not in the schema"));
  const json& outputs = node.at("outputs");
  const size_t returns = schema.returns().size();
  if (returns > 1 ? outputs.size() != returns : outputs.size() > 1) {
    return NodeError(node, absl::StrCat(outputs.size(), " outputs for ", returns, " returns"));
  }
  for (const json& output : outputs) {
    auto filled = OutputSlots(output, slots);
    if (!filled.ok()) return NodeError(node, filled.status().message());
    step.outputs.push_back(std::move(*filled));
  }
  for (const auto& [form_name, form] : kBatchNormForms) {
    if (name != form_name || !schema.argumentIndexWithName("running_mean")) continue;
    step.batch_norm = form;
    auto at = [&](const char* argument) { return schema.argumentIndexWithName(argument).value_or(0); };
    step.batch_norm_arguments = {at("input"), at("weight"), at("bias"), at("running_mean"), at("running_var"),
                                 at("momentum"), at("eps"), schema.argumentIndexWithName("training")};
  }
  step.dropout = IsDropoutOp(step.target);
  step.random = step.op->hasTag(at::Tag::nondeterministic_seeded);
  return absl::OkStatus();
}

absl::Status PlanSymbolic(const json& node, const std::string& target, Slots& slots, Step& step) {
  step.target = target;
  for (const auto& [op_name, op] : kSymbolicOps) {
    if (target == op_name) step.symbolic = op;
  }
  if (step.symbolic == SymbolicOp::kNone) return NodeError(node, "Recal does not run this function");
  for (const json& input : node.at("inputs")) {
    RECAL_ASSIGN_OR_RETURN(auto member, Member(input.at("arg")));
    auto source = Scalar(member.first, *member.second, c10::NumberType::get(), slots);
    if (!source.ok()) return NodeError(node, source.status().message());
    step.arguments.push_back(std::move(*source));
  }
  for (const json& output : node.at("outputs")) {
    RECAL_ASSIGN_OR_RETURN(std::vector<Slot> filled, OutputSlots(output, slots));
    step.outputs.push_back(std::move(filled));
  }
  return absl::OkStatus();
}

class OperatorPolicy {
 public:
  explicit OperatorPolicy(const GraphPolicy& policy) : trusted_(policy.trusted) {
    for (const std::string& op : AllowedOperators()) allowed_.insert(op);
    allowed_.insert(std::begin(kExportOnlyOps), std::end(kExportOnlyOps));
    allowed_.insert(std::begin(kQuantizedDecomposedOps), std::end(kQuantizedDecomposedOps));
    allowed_.insert(policy.extra_allowed_ops.begin(), policy.extra_allowed_ops.end());
  }
  bool Allows(const std::string& op) const { return trusted_ || allowed_.count(op) > 0; }

 private:
  const bool trusted_;
  std::set<std::string> allowed_;
};

// What planning a program and the graphs nested in it share.
struct PlanContext {
  const OperatorPolicy& policy;
  const c10::Device& device;
  int64_t nodes_left;  // of GraphPolicy::max_graph_nodes, over every graph
};

absl::StatusOr<Step> PlanNode(const json& node, PlanContext& context, int depth, Slots& slots);

// The graph a higher-order operator calls ({"name", "graph": {inputs, outputs, nodes, ...}}),
// in slots of its own: its values' names are its own (each branch of a torch.cond has a "mul").
absl::StatusOr<Graph> PlanSubgraph(const json& as_graph, PlanContext& context, int depth);

// A higher-order operator's argument that is not a graph, typed by what it holds (these
// operators have no schema): tensors and symbolic values are slots, the rest constants.
absl::StatusOr<ArgumentSource> UntypedArgument(const std::string& key, const json& value, const Slots& slots) {
  if (key == "as_tensor") {
    ArgumentSource source;
    source.kind = ArgumentSource::Kind::kSlot;
    RECAL_ASSIGN_OR_RETURN(source.slot, slots.Use(value.at("name").get<std::string>()));
    return source;
  }
  if (key == "as_none") return Constant(c10::IValue());
  if (key == "as_string") return Constant(value.get<std::string>());
  if (key == "as_scalar_type") {
    RECAL_ASSIGN_OR_RETURN(c10::ScalarType t, ScalarTypeOf(SchemaInt(value)));
    return Constant(static_cast<int64_t>(t));
  }
  if (key == "as_int" || key == "as_float" || key == "as_bool" || absl::StartsWith(key, "as_sym_")) {
    return Scalar(key, value, c10::NumberType::get(), slots);
  }
  return absl::InvalidArgumentError(absl::StrCat("an argument that is ", key, ", which Recal does not run"));
}

// torch/_export/serde/schema.py ArgumentKind.
constexpr int kKeywordArgument = 2;

constexpr std::pair<const char*, HigherOrder> kHigherOrders[] = {
    {"wrap_with_set_grad_enabled", HigherOrder::kSetGradEnabled},
    {"wrap_with_autocast", HigherOrder::kAutocast},
    {"tag_activation_checkpoint", HigherOrder::kActivationCheckpoint},
    {"cond", HigherOrder::kCond}};

bool IsConstant(const ArgumentSource& a, bool (c10::IValue::*is)() const) {
  return a.kind == ArgumentSource::Kind::kConstant && (a.constant.*is)();
}

// The arguments before the operands are what each operator takes: set_grad_enabled(enabled),
// autocast(device_type, dtype, enabled, cache_enabled), cond(pred); and as many graphs.
absl::Status CheckHigherOrderLayout(const Step& step) {
  const auto& a = step.arguments;
  const size_t graphs = step.subgraphs.size();
  const size_t leading = step.operands_begin;
  bool fits = false;
  switch (step.higher_order) {
    case HigherOrder::kSetGradEnabled:
      fits = graphs == 1 && leading == 1 && IsConstant(a[0], &c10::IValue::isBool);
      break;
    case HigherOrder::kAutocast:
      fits = graphs == 1 && leading == 4 && IsConstant(a[0], &c10::IValue::isString) &&
             (IsConstant(a[1], &c10::IValue::isInt) || IsConstant(a[1], &c10::IValue::isNone)) &&
             IsConstant(a[2], &c10::IValue::isBool) &&
             (IsConstant(a[3], &c10::IValue::isBool) || IsConstant(a[3], &c10::IValue::isNone));
      if (fits && a[0].constant.toStringRef() != "cpu" && a[0].constant.toStringRef() != "cuda") {
        return absl::InvalidArgumentError(absl::StrCat("an autocast region for device '", a[0].constant.toStringRef(),
                                                       "'; Recal runs autocast for cpu and cuda"));
      }
      break;
    case HigherOrder::kActivationCheckpoint:
      fits = graphs == 1 && leading == 0;
      break;
    case HigherOrder::kCond:
      fits = graphs == 2 && leading == 1 && (a[0].kind == ArgumentSource::Kind::kSlot || IsConstant(a[0], &c10::IValue::isBool)) &&
             step.subgraphs[0].results.size() == step.subgraphs[1].results.size();
      break;
    case HigherOrder::kNone:
      break;
  }
  if (!fits) return absl::InvalidArgumentError("arguments not laid out as torch exports this operator");
  const size_t operands = a.size() - leading;
  for (const Graph& graph : step.subgraphs) {
    if (graph.placeholders.size() != operands) {
      return absl::InvalidArgumentError(absl::StrCat("calls a graph of ", graph.placeholders.size(), " inputs with ",
                                                     operands, " operands"));
    }
  }
  return absl::OkStatus();
}

// The slots a higher-order operator's outputs fill, one per result of its graph(s).
absl::Status PlanHigherOrderOutputs(const json& node, Slots& slots, Step& step) {
  std::vector<Slot> filled;
  for (const json& output : node.at("outputs")) {
    RECAL_ASSIGN_OR_RETURN(std::vector<Slot> some, OutputSlots(output, slots));
    filled.insert(filled.end(), some.begin(), some.end());
  }
  const size_t results = step.subgraphs[0].results.size();
  const bool none = std::all_of(filled.begin(), filled.end(), [](Slot s) { return s == kNoSlot; });
  if (results == 0 && none) return absl::OkStatus();
  if (filled.size() != results) {
    return absl::InvalidArgumentError(absl::StrCat(filled.size(), " outputs for a graph of ", results, " results"));
  }
  for (Slot s : filled) step.outputs.push_back({s});
  return absl::OkStatus();
}

absl::Status PlanHigherOrder(const json& node, const std::string& name, PlanContext& context, int depth, Slots& slots,
                             Step& step) {
  step.target = absl::StrCat("higher_order::", name);
  for (const auto& [op_name, kind] : kHigherOrders) {
    if (name == op_name) step.higher_order = kind;
  }
  if (step.higher_order == HigherOrder::kNone) {
    return NodeError(node, "a higher-order operator Recal does not run (it runs torch.cond, torch.no_grad / "
                           "enable_grad and torch.autocast regions and activation checkpointing; loops and maps "
                           "are not among them): export without it");
  }
  bool graphs_done = false;
  for (const json& input : node.at("inputs")) {
    RECAL_ASSIGN_OR_RETURN(auto member, Member(input.at("arg")));
    const auto& [key, value] = member;
    // Checkpointing's options (use_reentrant, preserve_rng_state, ...) change how a backward
    // recomputes, not what the forward computes.
    if (step.higher_order == HigherOrder::kActivationCheckpoint &&
        SchemaInt(input.value("kind", json(1))) == kKeywordArgument) {
      if (key == "as_graph" || key == "as_tensor" || key == "as_tensors") return NodeError(node, "a keyword operand");
      continue;
    }
    if (key == "as_graph") {
      if (graphs_done) return NodeError(node, "graphs after operands");
      // Counted in arguments, not inputs: an as_tensors input before the graphs is as many
      // arguments as it lists (none, or several), and the layout check indexes arguments.
      if (step.subgraphs.empty()) step.operands_begin = step.arguments.size();
      auto graph = PlanSubgraph(*value, context, depth + 1);
      if (!graph.ok()) return graph.status();
      step.subgraphs.push_back(std::move(*graph));
      continue;
    }
    if (!step.subgraphs.empty()) graphs_done = true;
    if (key == "as_tensors") {
      for (const json& tensor : *value) {
        auto source = UntypedArgument("as_tensor", tensor, slots);
        if (!source.ok()) return NodeError(node, source.status().message());
        step.arguments.push_back(std::move(*source));
      }
      continue;
    }
    auto source = UntypedArgument(key, *value, slots);
    if (!source.ok()) return NodeError(node, source.status().message());
    step.arguments.push_back(std::move(*source));
  }
  if (absl::Status layout = CheckHigherOrderLayout(step); !layout.ok()) return NodeError(node, layout.message());
  for (const Graph& graph : step.subgraphs) {
    ForEachStep(graph, [&](const Step& inner) { step.writes_argument |= inner.writes_argument; });
  }
  if (absl::Status outputs = PlanHigherOrderOutputs(node, slots, step); !outputs.ok()) {
    return NodeError(node, outputs.message());
  }
  return absl::OkStatus();
}

absl::StatusOr<Step> PlanNode(const json& node, PlanContext& context, int depth, Slots& slots) {
  Step step;
  step.name = node.value("name", std::string());
  const std::string target = node.at("target").get<std::string>();
  if (!absl::StartsWith(target, "torch.ops.")) {
    RECAL_RETURN_IF_ERROR(PlanSymbolic(node, target, slots, step));
    return step;
  }
  std::vector<std::string> parts = absl::StrSplit(target.substr(sizeof("torch.ops.") - 1), '.');
  if (parts.size() == 2 && parts[0] == "higher_order") {
    RECAL_RETURN_IF_ERROR(PlanHigherOrder(node, parts[1], context, depth, slots, step));
    return step;
  }
  if (parts.size() != 3 || parts[0] == "higher_order") {
    return NodeError(node, "an operator name Recal cannot resolve");
  }
  const std::string op = absl::StrCat(parts[0], "::", parts[1]);
  if (!context.policy.Allows(op)) {
    return NodeError(node, absl::StrCat("operator ", op, " is not allowed on this server (only tensor math "
                                        "and shape operators run; an administrator can allow more with --extra_allowed_ops)"));
  }
  RECAL_RETURN_IF_ERROR(PlanOperator(node, parts[0], parts[1], parts[2], slots, context.device, step));
  if (absl::Status quantizer = PlanQuantizer(step); !quantizer.ok()) return NodeError(node, quantizer.message());
  if (step.batch_norm == BatchNormForm::kNone && absl::StrContains(parts[1], "batch_norm") &&
      step.op->schema().argumentIndexWithName("running_mean")) {
    return NodeError(node, "a BatchNorm form Recal cannot observe");
  }
  return step;
}

// "7:[s0,3,224,224]": a tensor value's dtype and sizes as the program states them.
std::string ValueType(const json& meta) {
  std::string type = absl::StrCat(SchemaInt(meta.value("dtype", json(-1))), ":[");
  for (const json& size : meta.value("sizes", json::array())) {
    if (size.contains("as_int")) absl::StrAppend(&type, SchemaInt(size.at("as_int")), ",");
    else if (size.contains("as_expr")) absl::StrAppend(&type, size.at("as_expr").value("expr_str", std::string("?")), ",");
    else absl::StrAppend(&type, "?,");
  }
  return type + "]";
}

// The nodes of `graph` (the program's or a nested one) into `out`.
absl::Status PlanSteps(const json& graph, PlanContext& context, int depth, Slots& slots, Graph& out) {
  const json& nodes = graph.at("nodes");
  context.nodes_left -= static_cast<int64_t>(nodes.size());
  if (context.nodes_left < 0) {
    return absl::InvalidArgumentError("exported program: more nodes (nested graphs included) than the allowed "
                                      "--max_graph_nodes");
  }
  for (const json& node : nodes) {
    RECAL_ASSIGN_OR_RETURN(Step step, PlanNode(node, context, depth, slots));
    out.steps.push_back(std::move(step));
  }
  out.slots = slots.count();
  out.value_types.assign(out.slots, std::string());
  const json& tensors = graph.value("tensor_values", json::object());
  for (const auto& [name, slot] : slots.by_name()) {
    auto meta = tensors.find(name);
    if (meta != tensors.end()) out.value_types[slot] = ValueType(*meta);
  }
  return absl::OkStatus();
}

// The slot of a graph's input or output ({"as_tensor": {"name"}}, {"as_sym_int": {"as_name"}}),
// kNoSlot for None; INVALID_ARGUMENT for a constant, which no graph torch exports returns.
absl::StatusOr<Slot> GraphValue(const json& value, Slots& slots, bool define) {
  RECAL_ASSIGN_OR_RETURN(auto member, Member(value));
  const auto& [key, inner] = member;
  std::string name;
  if (key == "as_tensor") name = inner->at("name").get<std::string>();
  else if (absl::StartsWith(key, "as_sym_") && inner->is_object() && inner->contains("as_name")) name = inner->at("as_name").get<std::string>();
  else if (key == "as_none") return kNoSlot;
  else return absl::InvalidArgumentError(absl::StrCat("a graph input or output that is ", key));
  if (define) return slots.Define(name);
  return slots.Use(name);
}

absl::StatusOr<Graph> PlanSubgraph(const json& as_graph, PlanContext& context, int depth) {
  const std::string name = as_graph.value("name", std::string("?"));
  if (depth > kMaxGraphNesting) {
    return absl::InvalidArgumentError(absl::StrCat("exported program: graph '", name, "' is nested ", depth,
                                                   " deep, more than the ", kMaxGraphNesting, " Recal runs"));
  }
  const json& graph = as_graph.at("graph");
  Slots slots;
  Graph out;
  for (const json& input : graph.at("inputs")) {
    RECAL_ASSIGN_OR_RETURN(Slot slot, GraphValue(input, slots, /*define=*/true));
    out.placeholders.push_back(slot);
  }
  RECAL_RETURN_IF_ERROR(PlanSteps(graph, context, depth, slots, out));
  for (const json& output : graph.at("outputs")) {
    auto slot = GraphValue(output, slots, /*define=*/false);
    if (!slot.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("exported program: graph '", name, "': ", slot.status().message()));
    }
    out.results.push_back(*slot);
  }
  return out;
}

absl::StatusOr<GraphInput> PlanInput(const json& spec, Slots& slots) {
  RECAL_ASSIGN_OR_RETURN(auto member, Member(spec));
  const auto& [key, value] = member;
  GraphInput input;
  if (key == "user_input") {
    RECAL_ASSIGN_OR_RETURN(auto arg, Member(value->at("arg")));
    if (arg.first != "as_tensor") {
      input.kind = GraphInput::Kind::kConstantValue;  // a non-tensor input, fixed at export
      return input;
    }
    input.name = input.placeholder = arg.second->at("name").get<std::string>();
  } else if (key == "parameter" || key == "buffer" || key == "tensor_constant") {
    input.kind = key == "parameter" ? GraphInput::Kind::kParameter
                 : key == "buffer"  ? GraphInput::Kind::kBuffer
                                    : GraphInput::Kind::kConstantTensor;
    input.name = value->at(key == "parameter" ? "parameter_name" : key == "buffer" ? "buffer_name"
                                                                                  : "tensor_constant_name")
                     .get<std::string>();
    input.placeholder = value->at("arg").at("name").get<std::string>();
    input.slot = slots.Define(input.placeholder);
    return input;
  } else if (key == "constant_input") {
    input.kind = GraphInput::Kind::kConstantValue;
    input.slot = slots.Define(value->at("name").get<std::string>());
    RECAL_ASSIGN_OR_RETURN(auto constant, Member(value->at("value")));
    const json& v = *constant.second;
    input.value = v.is_boolean() ? c10::IValue(v.get<bool>())
                  : v.is_number_integer() ? c10::IValue(v.get<int64_t>())
                  : v.is_number() ? c10::IValue(v.get<double>())
                  : v.is_string() ? c10::IValue(v.get<std::string>()) : c10::IValue();
    return input;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("exported program: an input of kind ", key,
                                                   " (custom objects, effect tokens), which Recal does not run"));
  }
  input.slot = slots.Define(input.name);
  return input;
}

absl::StatusOr<Plan> PlanGraph(const json& program, const GraphPolicy& policy, const c10::Device& device) {
  const json& module = program.at("graph_module");
  const json& graph = module.at("graph");
  const json& specs = module.at("signature").at("input_specs");
  if (static_cast<int64_t>(graph.at("nodes").size()) > policy.max_graph_nodes) {
    return absl::InvalidArgumentError(absl::StrCat("exported program: ", graph.at("nodes").size(),
                                                   " nodes, more than the ", policy.max_graph_nodes, " allowed"));
  }
  Slots slots;
  Plan plan;
  for (const json& spec : specs) {
    RECAL_ASSIGN_OR_RETURN(GraphInput input, PlanInput(spec, slots));
    if (input.kind == GraphInput::Kind::kUser) {
      const json& meta = graph.at("tensor_values").at(input.name);
      RECAL_ASSIGN_OR_RETURN(c10::ScalarType dtype, ScalarTypeOf(SchemaInt(meta.at("dtype"))));
      input.dtype = dtype;
    }
    plan.inputs.push_back(std::move(input));
  }
  const OperatorPolicy allowed(policy);
  PlanContext context{allowed, device, policy.max_graph_nodes};
  RECAL_RETURN_IF_ERROR(PlanSteps(graph, context, /*depth=*/0, slots, plan));
  // What the program returns counts as read: a value it returns is not only one step's.
  for (const json& output : graph.value("outputs", json::array())) {
    auto slot = GraphValue(output, slots, /*define=*/false);
    if (slot.ok() && *slot != kNoSlot) plan.results.push_back(*slot);
  }
  return plan;
}

}  // namespace

std::vector<Slot> SlotsRead(const Step& step) {
  std::vector<Slot> read;
  if (step.returns_argument) {
    const ArgumentSource& returned = step.arguments[*step.returns_argument];
    if (returned.kind == ArgumentSource::Kind::kSlot) read.push_back(returned.slot);
    return read;
  }
  for (const ArgumentSource& source : step.arguments) {
    if (source.kind == ArgumentSource::Kind::kSlot) read.push_back(source.slot);
    for (const auto& [slot, constant] : source.elements) {
      if (slot != kNoSlot) read.push_back(slot);
    }
  }
  return read;
}

void ForEachStep(Graph& graph, const std::function<void(Step&)>& visit) {
  for (Step& step : graph.steps) {
    visit(step);
    for (Graph& nested : step.subgraphs) ForEachStep(nested, visit);
  }
}

void ForEachStep(const Graph& graph, const std::function<void(const Step&)>& visit) {
  for (const Step& step : graph.steps) {
    visit(step);
    for (const Graph& nested : step.subgraphs) ForEachStep(nested, visit);
  }
}

absl::StatusOr<Plan> PlanProgram(const json& program, const GraphPolicy& policy, const c10::Device& device) {
  try {
    return PlanGraph(program, policy, device);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("exported program: malformed graph: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("exported program: ", e.what()));
  }
}

}  // namespace recal::engine::exported
