// An exported program's graph, parsed once into what running it needs: every node's
// operator resolved in the c10 dispatcher and checked against the allowlist, every argument
// typed by the operator's schema, every value given a slot. Nothing here runs anything.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "server/engine/graph_validation.h"
#include "server/engine/quantizers.h"

namespace recal::engine::exported {

// Graphs nested in graphs (a torch.cond inside an autocast region inside a no_grad block):
// what export makes of real models is one to three levels deep; deeper is crafted. (The
// JSON's own depth limit, 64, would stop nesting at about eight: each level costs seven.)
inline constexpr int kMaxGraphNesting = 5;

// Where a value lives while a forward runs: an index into its vector of values.
using Slot = int;
inline constexpr Slot kNoSlot = -1;

// How one argument of a call is made when the call runs.
struct ArgumentSource {
  enum class Kind { kConstant, kSlot, kList };
  Kind kind = Kind::kConstant;
  c10::IValue constant;  // kConstant
  Slot slot = kNoSlot;   // kSlot
  // kList: each element a slot, or (kNoSlot) the constant beside it (SymInt[] mixes both).
  std::vector<std::pair<Slot, c10::IValue>> elements;
  c10::TypePtr list_type;  // kList: the schema's list type
};

// The forms of BatchNorm an exported graph holds (the training IR's, and the decomposed ones).
enum class BatchNormForm {
  kNone,
  kBatchNorm,             // aten.batch_norm
  kNative,                // aten.native_batch_norm
  kLegit,                 // aten._native_batch_norm_legit
  kLegitFunctional,       // aten._native_batch_norm_legit_functional
  kLegitNoTraining,       // aten._native_batch_norm_legit_no_training
  kWithUpdate,            // aten._batch_norm_with_update
  kNoUpdate,              // aten._batch_norm_no_update
};

// The higher-order operators Recal runs: regions users write inside forward, each a nested
// graph called with operands (torch.no_grad / enable_grad, torch.autocast, activation
// checkpointing), and torch.cond, which calls one of two.
enum class HigherOrder { kNone, kSetGradEnabled, kAutocast, kActivationCheckpoint, kCond };

// Python's operator and math functions on symbolic sizes (_operator.mul, torch.sym_max, ...).
enum class SymbolicOp { kNone, kAdd, kSub, kMul, kFloorDiv, kTrueDiv, kMod, kNeg, kEq, kNe, kLt, kLe, kGt, kGe,
                        kAnd, kOr, kNot, kMax, kMin, kToFloat, kToInt, kCeil, kFloor };

// Where a BatchNorm step's arguments are in its schema (the forms order them differently).
struct BatchNormArguments {
  int input = 0, weight = 0, bias = 0, running_mean = 0, running_var = 0, momentum = 0, eps = 0;
  std::optional<int> training;  // absent from the forms that fix it (_no_training, _with_update, ...)
};

struct Graph;

struct Step {
  std::string name;    // the node's name, for messages
  std::string target;  // "aten::conv2d" or "_operator.mul"
  std::optional<c10::OperatorHandle> op;
  SymbolicOp symbolic = SymbolicOp::kNone;
  BatchNormForm batch_norm = BatchNormForm::kNone;
  BatchNormArguments batch_norm_arguments;  // with batch_norm
  bool writes_argument = false;  // an in-place operator: it runs even when its result is unused
  bool dropout = false;          // its `train` argument follows Options::modules
  bool random = false;           // draws random numbers (dropout, bernoulli, rand, ...)
  // A quantizer (server/engine/quantizers.h); an observing one runs as
  // recal::frozen_fake_quantize (exported/quantizers.h).
  QuantizerKind quantizer = QuantizerKind::kNone;
  // Part of a random mask that eval mode does not compute (eval_mode.h): never runs.
  bool eliminated = false;
  // Returns its argument at this index instead of calling its operator: the multiply that
  // applied such a mask (eval_mode.h).
  std::optional<int> returns_argument;
  std::vector<ArgumentSource> arguments;  // in schema order; a higher-order operator's in the node's order
  // A higher-order operator: its nested graphs (torch.cond: the true one, then the false
  // one), and where in `arguments` the operands they are called with begin.
  HigherOrder higher_order = HigherOrder::kNone;
  std::vector<Graph> subgraphs;
  size_t operands_begin = 0;
  // Per return of the operator: the slots it fills (one, or one per element of a list
  // return; kNoSlot where the graph ignores it).
  std::vector<std::vector<Slot>> outputs;
};

struct GraphInput {
  enum class Kind { kUser, kParameter, kBuffer, kConstantTensor, kConstantValue };
  Kind kind = Kind::kUser;
  Slot slot = kNoSlot;
  std::string name;                      // state_dict key or constant name; the placeholder for user inputs
  std::string placeholder;               // the graph's name for it
  std::optional<c10::ScalarType> dtype;  // kUser tensors: the dtype the program was exported with
  c10::IValue value;                     // kConstantValue
};

// Steps over values in slots: the program's graph, or one nested in a higher-order operator.
struct Graph {
  int slots = 0;
  std::vector<Step> steps;
  // By slot: a tensor's dtype and sizes as exported ("7:[s0,3,224,224]" in the program's own
  // notation), empty for other values. Two values of equal type have the same dtype and shape.
  std::vector<std::string> value_types;
  std::vector<Slot> placeholders;  // a nested graph's: the slots its operands fill, in order
  std::vector<Slot> results;       // the slots it returns, in order (kNoSlot: None or a constant)
};

struct Plan : Graph {
  std::vector<GraphInput> inputs;  // in the graph's order
};

// The slots a step reads (of one that returns an argument, that argument's alone).
std::vector<Slot> SlotsRead(const Step& step);

// Runs `visit` on every step of `graph` and of the graphs nested in its steps, outer first.
void ForEachStep(Graph& graph, const std::function<void(Step&)>& visit);
void ForEachStep(const Graph& graph, const std::function<void(const Step&)>& visit);

// INVALID_ARGUMENT naming the node for anything Recal cannot run exactly: an operator
// outside the allowlist (unless policy.trusted; the same in every nested graph), a
// higher-order operator other than the four of HigherOrder (while_loop, map, ...) or nested
// deeper than kMaxGraphNesting, custom objects, more nodes (nested ones included) than
// policy.max_graph_nodes, malformed JSON.
// Device arguments in the graph become `device`: the whole program runs on one.
absl::StatusOr<Plan> PlanProgram(const nlohmann::json& program, const GraphPolicy& policy,
                                 const c10::Device& device);

}  // namespace recal::engine::exported
