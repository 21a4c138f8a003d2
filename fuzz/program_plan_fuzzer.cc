// An exported program's JSON (models/<name>.json of a PT2 archive: the input) as a load
// reads it, after the archive: parsed under the archive's limits (ParseArchiveJson,
// server/engine/exported/pt2_archive.cc), planned (PlanProgram, program_plan.cc: each node's
// operator found in the dispatcher and checked against the allowlist, each argument typed by
// its schema, each value given a slot, the graphs of torch.cond and of regions nested) and its
// input contract read (ReadInputContract, input_contract.cc), as LoadExportedModel does
// before it reads a weight. The zip's CRCs keep pt2_archive's mutations out of this JSON;
// here every byte of it is the fuzzer's.
//
// Contract: malformed JSON, wrong types, deep nesting, unknown or disallowed operators and
// values used before they are made are refused with INVALID_ARGUMENT and a message, never an
// exception or a crash. A plan refers only to slots of its own graph (arguments, outputs,
// placeholders, results, of nested graphs too), a BatchNorm step's argument positions lie
// among its arguments, an operator step has one argument per schema argument, a higher-order
// step as many operands as each of its graphs takes; the input contract lists the plan's
// tensor user inputs, in order, with their dtypes. Eval mode's rewrite of the plan
// (ReplaceRandomMasks, eval_mode.cc: proved random masks eliminated, their multiply returning
// the activation) leaves every graph runnable: no step that still runs, and no result, reads
// a slot that only eliminated steps fill; a multiply returns a value its graph holds; a second
// rewrite finds nothing left to replace.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/core/Device.h>

#include "fuzz/fuzz_util.h"
#include "server/engine/exported/eval_mode.h"
#include "server/engine/exported/input_contract.h"
#include "server/engine/exported/program_plan.h"
#include "server/engine/exported/pt2_archive.h"
#include "server/engine/graph_validation.h"

namespace {

namespace exported = recal::engine::exported;
using exported::ArgumentSource;
using exported::Graph;
using exported::kNoSlot;
using exported::Slot;
using exported::Step;
using recal::fuzz::CheckRefusal;

void CheckSlot(const Graph& graph, Slot slot, bool may_be_none, const std::string& what) {
  FUZZ_CHECK((may_be_none && slot == kNoSlot) || (0 <= slot && slot < graph.slots), what, ": slot ", slot,
             " of a graph of ", graph.slots);
}

void CheckGraph(const Graph& graph, int depth) {
  FUZZ_CHECK(depth <= exported::kMaxGraphNesting, "a graph nested ", depth, " deep");
  FUZZ_CHECK(graph.value_types.size() == static_cast<size_t>(graph.slots), "value_types");
  for (Slot s : graph.placeholders) CheckSlot(graph, s, false, "a placeholder");
  for (Slot s : graph.results) CheckSlot(graph, s, true, "a result");
  for (const Step& step : graph.steps) {
    const std::string node = "node '" + step.name + "' (" + step.target + ")";
    for (const ArgumentSource& argument : step.arguments) {
      if (argument.kind == ArgumentSource::Kind::kSlot) CheckSlot(graph, argument.slot, false, node + " argument");
      for (const auto& [slot, constant] : argument.elements) CheckSlot(graph, slot, true, node + " list element");
    }
    for (const auto& slots : step.outputs) {
      for (Slot s : slots) CheckSlot(graph, s, true, node + " output");
    }
    if (step.op && step.higher_order == exported::HigherOrder::kNone) {
      FUZZ_CHECK(step.arguments.size() == step.op->schema().arguments().size(), node, ": ", step.arguments.size(),
                 " arguments for ", step.op->schema().arguments().size(), " in the schema");
    }
    if (step.batch_norm != exported::BatchNormForm::kNone) {
      const auto& at = step.batch_norm_arguments;
      for (int i : {at.input, at.weight, at.bias, at.running_mean, at.running_var, at.momentum, at.eps,
                    at.training.value_or(0)}) {
        FUZZ_CHECK(0 <= i && static_cast<size_t>(i) < step.arguments.size(), node, ": BatchNorm argument ", i);
      }
    }
    FUZZ_CHECK(step.subgraphs.empty() || step.higher_order != exported::HigherOrder::kNone, node, ": graphs");
    if (step.higher_order != exported::HigherOrder::kNone) {
      FUZZ_CHECK(!step.subgraphs.empty() && step.operands_begin <= step.arguments.size(), node, ": operands begin at ",
                 step.operands_begin, " of ", step.arguments.size(), " arguments");
      for (const Graph& nested : step.subgraphs) {
        FUZZ_CHECK(nested.placeholders.size() == step.arguments.size() - step.operands_begin, node,
                   ": a graph of ", nested.placeholders.size(), " inputs");
        CheckGraph(nested, depth + 1);
      }
    }
  }
}

// After ReplaceRandomMasks: what still runs reads only values that something still running
// (or the graph's caller) fills.
void CheckRunnable(const Graph& graph) {
  std::vector<bool> filled_by_running(static_cast<size_t>(graph.slots), false);
  std::vector<bool> filled_by_eliminated(static_cast<size_t>(graph.slots), false);
  for (const Step& step : graph.steps) {
    for (const auto& slots : step.outputs) {
      for (Slot s : slots) {
        if (s != kNoSlot) (step.eliminated ? filled_by_eliminated : filled_by_running)[s] = true;
      }
    }
  }
  auto lost = [&](Slot s) { return s != kNoSlot && filled_by_eliminated[s] && !filled_by_running[s]; };
  for (const Step& step : graph.steps) {
    const std::string node = "node '" + step.name + "' (" + step.target + ")";
    if (step.returns_argument) {
      FUZZ_CHECK(!step.eliminated, node, ": eliminated and returning its argument");
      const int i = *step.returns_argument;
      FUZZ_CHECK(0 <= i && static_cast<size_t>(i) < step.arguments.size() &&
                     step.arguments[i].kind == ArgumentSource::Kind::kSlot,
                 node, ": returns argument ", i, ", not a value of its graph");
    }
    if (step.eliminated) continue;
    for (Slot s : exported::SlotsRead(step)) FUZZ_CHECK(!lost(s), node, " reads slot ", s, " of an eliminated step");
    for (const Graph& nested : step.subgraphs) CheckRunnable(nested);
  }
  for (Slot s : graph.results) FUZZ_CHECK(!lost(s), "the graph returns slot ", s, " of an eliminated step");
}

void CheckContract(const exported::Plan& plan, const recal::ModelInputs& contract) {
  int next = 0;
  for (const exported::GraphInput& input : plan.inputs) {
    CheckSlot(plan, input.slot, input.kind == exported::GraphInput::Kind::kConstantValue, "input " + input.name);
    if (input.kind != exported::GraphInput::Kind::kUser) continue;
    FUZZ_CHECK(next < contract.size() && contract[next].name() == input.name, "the contract's input ", next,
               " is not ", input.name);
    FUZZ_CHECK(input.dtype && contract[next].dtype() == c10::getDtypeNames(*input.dtype).first, "dtype of ",
               input.name);
    ++next;
  }
  FUZZ_CHECK(next == contract.size(), "the contract has ", contract.size(), " inputs, the plan ", next);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto program = exported::ParseArchiveJson("models/model.json", text, exported::ArchiveLimits{});
  if (!program.ok()) {
    CheckRefusal(program.status(), "ParseArchiveJson");
    return 0;
  }
  auto plan = exported::PlanProgram(*program, recal::engine::GraphPolicy{}, c10::Device(c10::kCPU));
  auto contract = exported::ReadInputContract(*program);
  if (!contract.ok()) CheckRefusal(contract.status(), "ReadInputContract");
  if (!plan.ok()) {
    CheckRefusal(plan.status(), "PlanProgram");
    FUZZ_CHECK(plan.status().code() == absl::StatusCode::kInvalidArgument, plan.status().ToString());
    return 0;
  }
  CheckGraph(*plan, 0);
  if (contract.ok()) CheckContract(*plan, *contract);
  exported::ReplaceRandomMasks(*plan);
  CheckRunnable(*plan);
  FUZZ_CHECK(exported::ReplaceRandomMasks(*plan) == 0, "a second rewrite found more masks");
  return 0;
}
