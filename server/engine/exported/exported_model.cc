#include "server/engine/exported/exported_model.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/engine/exported/eval_mode.h"
#include "server/engine/exported/input_contract.h"
#include "server/engine/exported/interpreter.h"
#include "server/engine/exported/program_plan.h"
#include "server/engine/exported/pt2_archive.h"
#include "server/engine/exported/quantizers.h"
#include "server/engine/exported/serialized_types.h"

namespace recal::engine::exported {
namespace {

// OK when a stored tensor is what the graph was traced with: an archive whose weights were
// swapped for other shapes or dtypes is refused before it runs.
absl::Status MatchesGraph(const nlohmann::json& program, const GraphInput& input, const at::Tensor& tensor) {
  try {
    const nlohmann::json& meta = program.at("graph_module").at("graph").at("tensor_values").at(input.placeholder);
    auto sizes = ConcreteInts(meta.at("sizes"));
    auto dtype = ScalarTypeOf(SchemaInt(meta.at("dtype")));
    if (sizes.ok() && dtype.ok() && tensor.sizes() == at::IntArrayRef(*sizes) && tensor.scalar_type() == *dtype) {
      return absl::OkStatus();
    }
  } catch (const nlohmann::json::exception&) {
  }
  return absl::InvalidArgumentError(absl::StrCat("PT2 archive: '", input.name, "' (", std::string(tensor.dtype().name()),
                                                 " ", c10::str(tensor.sizes()),
                                                 ") is not the tensor the program was exported with"));
}

class ExportedModel final : public ObservedModel {
 public:
  ExportedModel(Pt2Archive archive, Plan plan, ModelInputs inputs, c10::Device device)
      : archive_(std::move(archive)),
        plan_(std::move(plan)),
        inputs_(std::move(inputs)),
        device_(device),
        state_(plan_.slots) {}

  absl::Status LoadState();

  ModelFormat format() const override { return ModelFormat::kExportedProgram; }
  const ModelInputs& inputs() const override { return inputs_; }
  const NamedTensors& buffers() const override { return buffers_; }
  std::vector<std::pair<at::Tensor, at::Tensor>> BatchNormBuffers() const override;
  absl::StatusOr<int> Observe(Collector* collector, v1::ModuleMode modules, bool end_at_last_batch_norm) override;
  QuantizerCounts Quantizers() const override { return CountQuantizers(plan_); }
  NamedTensors QuantizerState() const override;
  std::vector<at::Tensor> ConvolutionWeights() const override;
  void LayOutWeights(at::MemoryFormat format) override;
  void Forward(const std::vector<at::Tensor>& inputs) override;
  absl::StatusOr<std::string> Serialize(const NamedTensors& buffers) const override {
    return archive_.WithTensors(buffers);
  }
  absl::Status CheckReloads(absl::string_view bytes, const NamedTensors& buffers) const override;

 private:
  // The steps a forward runs, and after each the slots nothing later reads.
  void Schedule(bool end_at_last_batch_norm);
  // Calls `found` with the slots of the running mean and variance of every BatchNorm step,
  // nested ones included, whose statistics are buffers of the program.
  void ForEachObservedBatchNorm(const std::function<void(Slot, Slot)>& found) const;
  // INVALID_ARGUMENT naming a random operator other than dropout that the forward runs.
  absl::Status CheckNoRandomness() const;

  Pt2Archive archive_;
  Plan plan_;
  const ModelInputs inputs_;  // the contract the program was exported with
  const c10::Device device_;
  std::vector<c10::IValue> state_;  // by slot: parameters, buffers, constants
  NamedTensors buffers_;
  std::set<Slot> buffer_slots_;
  Collector* collector_ = nullptr;
  std::vector<size_t> run_;
  std::vector<std::vector<Slot>> release_;  // parallel to run_
};

absl::Status ExportedModel::LoadState() {
  Pt2Archive::RecordCache records;
  for (const GraphInput& input : plan_.inputs) {
    if (input.kind == GraphInput::Kind::kUser) continue;
    if (input.kind == GraphInput::Kind::kConstantValue) {
      if (input.slot != kNoSlot) state_[input.slot] = input.value;
      continue;
    }
    const StoredTensor* stored = archive_.Find(input.name);
    if (stored == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("PT2 archive: the program reads '", input.name,
                                                     "', which the archive does not hold"));
    }
    RECAL_ASSIGN_OR_RETURN(at::Tensor tensor, archive_.Load(*stored, &records));
    RECAL_RETURN_IF_ERROR(MatchesGraph(archive_.program(), input, tensor));
    tensor = tensor.to(device_);
    state_[input.slot] = tensor;
    if (input.kind == GraphInput::Kind::kBuffer) {
      buffers_.emplace_back(input.name, tensor);
      buffer_slots_.insert(input.slot);
    }
  }
  return absl::OkStatus();
}

// The BatchNorm steps of `graph` whose statistics are state slots: `origin` gives, by slot
// of `graph`, the buffer slot of the program's state the value is (kNoSlot: none). A nested
// graph's placeholders are what its operands are.
void VisitBatchNorms(const Graph& graph, const std::vector<Slot>& origin,
                     const std::function<void(Slot, Slot)>& found) {
  for (const Step& step : graph.steps) {
    if (step.eliminated) continue;
    if (step.batch_norm != BatchNormForm::kNone) {
      const ArgumentSource& mean = step.arguments[step.batch_norm_arguments.running_mean];
      const ArgumentSource& var = step.arguments[step.batch_norm_arguments.running_var];
      if (mean.kind == ArgumentSource::Kind::kSlot && var.kind == ArgumentSource::Kind::kSlot &&
          origin[mean.slot] != kNoSlot && origin[var.slot] != kNoSlot) {
        found(origin[mean.slot], origin[var.slot]);
      }
    }
    for (const Graph& nested : step.subgraphs) {
      std::vector<Slot> inner(nested.slots, kNoSlot);
      for (size_t i = 0; i < nested.placeholders.size(); ++i) {
        const ArgumentSource& operand = step.arguments[step.operands_begin + i];
        if (operand.kind == ArgumentSource::Kind::kSlot) inner[nested.placeholders[i]] = origin[operand.slot];
      }
      VisitBatchNorms(nested, inner, found);
    }
  }
}

// A BatchNorm step, or a higher-order one whose graphs hold one.
bool HasBatchNorm(const Step& step) {
  if (step.batch_norm != BatchNormForm::kNone) return true;
  for (const Graph& nested : step.subgraphs) {
    for (const Step& inner : nested.steps) {
      if (HasBatchNorm(inner)) return true;
    }
  }
  return false;
}

// `step`, or the first step nested in it, that draws random numbers and is neither dropout
// nor part of a proved mask; nullptr if none.
const Step* UnprovedRandomness(const Step& step) {
  if (step.eliminated) return nullptr;
  if (step.random && !step.dropout && !step.returns_argument) return &step;
  for (const Graph& nested : step.subgraphs) {
    for (const Step& inner : nested.steps) {
      if (const Step* found = UnprovedRandomness(inner)) return found;
    }
  }
  return nullptr;
}

void ExportedModel::ForEachObservedBatchNorm(const std::function<void(Slot, Slot)>& found) const {
  std::vector<Slot> origin(plan_.slots, kNoSlot);
  for (Slot s : buffer_slots_) origin[s] = s;
  VisitBatchNorms(plan_, origin, found);
}

std::vector<std::pair<at::Tensor, at::Tensor>> ExportedModel::BatchNormBuffers() const {
  std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
  std::set<Slot> seen;
  ForEachObservedBatchNorm([&](Slot mean, Slot var) {
    if (seen.insert(mean).second) pairs.emplace_back(state_[mean].toTensor(), state_[var].toTensor());
  });
  // A BatchNorm module the forward never calls has no node, but export keeps its buffers:
  // declared by their names, as a TorchScript module's running_mean / running_var are, so
  // that the report lists it as unused.
  std::map<std::string, Slot> by_name;
  for (const GraphInput& input : plan_.inputs) {
    if (input.kind == GraphInput::Kind::kBuffer) by_name.emplace(input.name, input.slot);
  }
  for (const auto& [name, slot] : by_name) {
    const std::string suffix = "running_mean";
    if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    auto var = by_name.find(name.substr(0, name.size() - suffix.size()) + "running_var");
    if (var != by_name.end() && seen.insert(slot).second) {
      pairs.emplace_back(state_[slot].toTensor(), state_[var->second].toTensor());
    }
  }
  return pairs;
}

absl::StatusOr<int> ExportedModel::Observe(Collector* collector, v1::ModuleMode modules, bool end_at_last_batch_norm) {
  bool observed = false;
  ForEachObservedBatchNorm([&](Slot, Slot) { observed = true; });
  if (!observed) {
    return absl::InvalidArgumentError(
        "the exported program has no BatchNorm with running statistics (no batch_norm node reads "
        "running_mean / running_var buffers): there is nothing to recalibrate");
  }
  collector_ = collector;
  // A train-mode export bakes in stochastic depth and masks like it: replaced by what eval
  // mode computes where the graph proves what they are (eval_mode.h).
  if (modules == v1::EVAL) ReplaceRandomMasks(plan_);
  if (modules == v1::EVAL || modules == v1::TRAIN) {
    ForEachStep(plan_, [&](Step& step) {
      if (!step.dropout) return;
      if (auto train = step.op->schema().argumentIndexWithName("train")) {
        step.arguments[*train].kind = ArgumentSource::Kind::kConstant;
        step.arguments[*train].constant = modules == v1::TRAIN;
      }
    });
  }
  Schedule(end_at_last_batch_norm);
  if (modules == v1::EVAL) RECAL_RETURN_IF_ERROR(CheckNoRandomness());
  return static_cast<int>(plan_.steps.size() - run_.size());
}

absl::Status ExportedModel::CheckNoRandomness() const {
  for (size_t i : run_) {
    const Step* step = UnprovedRandomness(plan_.steps[i]);
    if (step == nullptr) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "the exported program draws random numbers before its last BatchNorm (node '", step->name, "', ",
        step->target, ", baked in when it was exported in train mode) that are neither dropout nor a "
        "mask Recal can prove eval mode drops (a Bernoulli draw of a constant keep probability, optionally "
        "divided by it, multiplied into an activation: stochastic depth), so modules=eval cannot be "
        "honoured: export the model in eval mode (model.eval() before torch.export.export; BatchNorm is "
        "recalibrated either way), or ask for modules=train or as_saved to keep the randomness"));
  }
  return absl::OkStatus();
}

void ExportedModel::Schedule(bool end_at_last_batch_norm) {
  // The last BatchNorm of any kind: a later call of a layer may read the statistics an
  // earlier one returned (the functional form), not the buffer itself.
  size_t end = plan_.steps.size();
  if (end_at_last_batch_norm) {
    while (end > 0 && !HasBatchNorm(plan_.steps[end - 1])) --end;
  }
  // Backwards from the end: a step runs if it observes a BatchNorm, writes in place (its
  // effect may be read through another name), or makes something a running step reads.
  std::vector<bool> needed(plan_.slots, false);
  std::vector<size_t> run;
  for (size_t i = end; i-- > 0;) {
    const Step& step = plan_.steps[i];
    if (step.eliminated) continue;
    bool keep = !end_at_last_batch_norm || HasBatchNorm(step) || step.writes_argument;
    for (const auto& slots : step.outputs) {
      for (Slot s : slots) keep |= s != kNoSlot && needed[s];
    }
    if (!keep) continue;
    run.push_back(i);
    for (Slot s : SlotsRead(step)) needed[s] = true;
  }
  std::reverse(run.begin(), run.end());
  // Each value is dropped after the last step that reads it, or at once if none does.
  std::vector<int> last_use(plan_.slots, -1);
  for (size_t k = 0; k < run.size(); ++k) {
    for (Slot s : SlotsRead(plan_.steps[run[k]])) last_use[s] = static_cast<int>(k);
    for (const auto& slots : plan_.steps[run[k]].outputs) {
      for (Slot s : slots) {
        if (s != kNoSlot && last_use[s] < static_cast<int>(k)) last_use[s] = static_cast<int>(k);
      }
    }
  }
  release_.assign(run.size(), {});
  for (Slot s = 0; s < plan_.slots; ++s) {
    if (last_use[s] >= 0) release_[last_use[s]].push_back(s);
  }
  run_ = std::move(run);
}

NamedTensors ExportedModel::QuantizerState() const {
  // The program's own steps: a quantizer in a nested graph reads its operands' slots, not
  // the state's (the fused ones there run frozen all the same).
  std::set<Slot> read;
  for (const Step& step : plan_.steps) {
    for (Slot s : QuantizerParameterSlots(step)) read.insert(s);
  }
  NamedTensors state;
  for (const GraphInput& input : plan_.inputs) {
    if (input.kind == GraphInput::Kind::kBuffer && read.count(input.slot) > 0) {
      state.emplace_back(input.name, state_[input.slot].toTensor());
    }
  }
  return state;
}

std::vector<at::Tensor> ExportedModel::ConvolutionWeights() const {
  std::vector<at::Tensor> weights;
  for (const GraphInput& input : plan_.inputs) {
    if (input.kind == GraphInput::Kind::kParameter && state_[input.slot].toTensor().dim() == 4) {
      weights.push_back(state_[input.slot].toTensor());
    }
  }
  return weights;
}

void ExportedModel::LayOutWeights(at::MemoryFormat format) {
  for (const GraphInput& input : plan_.inputs) {
    if (input.kind != GraphInput::Kind::kParameter) continue;
    const at::Tensor t = state_[input.slot].toTensor();
    if (t.dim() == 4 && !t.is_contiguous(format)) state_[input.slot] = t.contiguous(format);
  }
}

void ExportedModel::Forward(const std::vector<at::Tensor>& inputs) {
  std::vector<c10::IValue> values = state_;
  size_t next = 0;
  for (const GraphInput& input : plan_.inputs) {
    if (input.kind != GraphInput::Kind::kUser) continue;
    TORCH_CHECK(next < inputs.size(), "the program takes more inputs than the batch has (", inputs.size(), ")");
    at::Tensor value = inputs[next++];
    if (input.dtype && value.is_floating_point() && at::isFloatingType(*input.dtype) && value.scalar_type() != *input.dtype) {
      value = value.to(*input.dtype);  // a float64 program fed float32 data, as its user would cast it
    }
    values[input.slot] = std::move(value);
  }
  TORCH_CHECK(next == inputs.size(), "the program takes ", next, " inputs, the batch has ", inputs.size());
  for (size_t k = 0; k < run_.size(); ++k) {
    RunStep(plan_.steps[run_[k]], values, collector_);
    for (Slot s : release_[k]) values[s] = c10::IValue();
  }
}

absl::Status ExportedModel::CheckReloads(absl::string_view bytes, const NamedTensors& buffers) const {
  auto reloaded = Pt2Archive::Read(BytesReader(bytes), ArchiveLimits{});
  if (!reloaded.ok()) return absl::InternalError(absl::StrCat("the recalibrated program does not reload: ", reloaded.status().message()));
  for (const auto& [name, value] : buffers) {
    const StoredTensor* stored = reloaded->Find(name);
    if (stored == nullptr) return absl::InternalError(absl::StrCat("the saved program lost ", name));
    auto tensor = reloaded->Load(*stored);
    if (!tensor.ok() || !tensor->equal(value.to(tensor->scalar_type()).cpu())) {
      return absl::InternalError(absl::StrCat("the saved program does not hold the new ", name));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ObservedModel>> LoadExportedModel(std::shared_ptr<ReadAdapter> file,
                                                                  const LoadOptions& options) {
  RECAL_ASSIGN_OR_RETURN(Pt2Archive archive, Pt2Archive::Read(std::move(file), ArchiveLimits{}));
  RECAL_ASSIGN_OR_RETURN(Plan plan, PlanProgram(archive.program(), options.graph_policy, options.device));
  RECAL_ASSIGN_OR_RETURN(ModelInputs inputs, ReadInputContract(archive.program()));
  auto model = std::make_unique<ExportedModel>(std::move(archive), std::move(plan), std::move(inputs), options.device);
  RECAL_RETURN_IF_ERROR(model->LoadState());
  return std::unique_ptr<ObservedModel>(std::move(model));
}

}  // namespace recal::engine::exported
