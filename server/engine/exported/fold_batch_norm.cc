#include "server/engine/exported/fold_batch_norm.h"

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "server/engine/dropout_ops.h"
#include "server/engine/torch_error.h"

namespace recal::engine::exported {
namespace {

using nlohmann::json;

constexpr char kOps[] = "torch.ops.aten.";
// The BatchNorm forms folded: the training IR's (torch.export.export) and the eval form of
// the core ATen IR (run_decompositions of an eval-mode program).
const std::set<std::string> kFoldedForms = {"batch_norm.default", "_native_batch_norm_legit_no_training.default"};
// Forms whose `training` argument eval mode turns off in place.
const std::set<std::string> kSwitchableForms = {"batch_norm.default", "native_batch_norm.default",
                                                "_native_batch_norm_legit.default"};
// Layers whose output channel is the weight's first dimension.
const std::set<std::string> kLinearLayers = {"conv1d.default", "conv2d.default", "conv3d.default",
                                             "convolution.default", "linear.default"};

// "batch_norm.default" of "torch.ops.aten.batch_norm.default"; "" for other namespaces.
std::string AtenOp(const json& node) {
  const std::string target = node.value("target", "");
  return absl::StartsWith(target, kOps) ? target.substr(sizeof(kOps) - 1) : "";
}

std::string OpName(const std::string& aten_op) { return aten_op.substr(0, aten_op.find('.')); }

bool IsBatchNorm(const std::string& aten_op) { return absl::StrContains(OpName(aten_op), "batch_norm"); }

// A random draw, as the planner tells one (program_plan.cc): the dispatcher's tag.
bool IsRandom(const std::string& aten_op) {
  const size_t dot = aten_op.find('.');
  const std::string overload = dot == std::string::npos ? "" : aten_op.substr(dot + 1);
  const auto op = c10::Dispatcher::singleton().findSchema(
      {absl::StrCat("aten::", OpName(aten_op)), overload == "default" ? "" : overload});
  return op.has_value() && op->hasTag(at::Tag::nondeterministic_seeded);
}

// The argument named `name` of `node`; nullptr when the node leaves it at its default.
json* Argument(json& node, absl::string_view name) {
  for (json& input : node["inputs"]) {
    if (input.value("name", "") == name) return &input["arg"];
  }
  return nullptr;
}

std::optional<std::string> TensorName(const json* arg) {
  if (arg == nullptr || !arg->contains("as_tensor")) return std::nullopt;
  return arg->at("as_tensor").at("name").get<std::string>();
}

// Calls `found` with every tensor name `value` reads (as_tensor and as_tensors, at any depth).
template <typename Json, typename Found>
void ForEachTensorRead(Json& value, const Found& found) {
  if (value.is_object()) {
    if (value.contains("as_tensor") && value["as_tensor"].is_object()) found(value["as_tensor"]["name"]);
    if (value.contains("as_tensors") && value["as_tensors"].is_array()) {
      for (auto& element : value["as_tensors"]) {
        if (element.is_object() && element.contains("name")) found(element["name"]);
      }
    }
  }
  if (value.is_structured()) {
    for (auto& item : value) ForEachTensorRead(item, found);
  }
}

bool HasNestedGraph(const json& value) {
  if (value.is_object() && value.contains("as_graph")) return true;
  if (!value.is_structured()) return false;
  for (const json& item : value) {
    if (HasNestedGraph(item)) return true;
  }
  return false;
}

// A parameter or persistent buffer the graph reads through a placeholder.
struct StateInput {
  std::string key;  // state_dict key
  bool parameter = false;
  size_t spec = 0;  // index in the signature's input_specs (and the graph's inputs)
};

// The arithmetic of one fold: what it reads and what it writes.
struct Fold {
  size_t batch_norm_node = 0;
  size_t layer_node = 0;
  std::string name;              // the BatchNorm layer's
  std::string input, output;     // the tensor the BatchNorm reads (the layer's output), and makes
  std::string weight_key;        // the layer's weight
  std::optional<std::string> bias_key;  // the layer's bias, where it has one
  std::optional<std::string> gamma_key, beta_key;
  std::string mean_key, var_key;
  double eps = 0;
};

class ProgramFolder {
 public:
  explicit ProgramFolder(const Pt2Archive& archive) : archive_(archive), program_(archive.program()) {}

  absl::StatusOr<FoldedModel> Run();

 private:
  json& graph() { return program_["graph_module"]["graph"]; }
  json& nodes() { return graph()["nodes"]; }
  json& input_specs() { return program_["graph_module"]["signature"]["input_specs"]; }

  void IndexGraph();
  // The fold of the BatchNorm at node `index`, or why there is none.
  std::variant<Fold, std::string> Plan(size_t index);
  std::variant<Fold, std::string> PlanLayer(size_t index, Fold fold);
  const StateInput* State(const std::optional<std::string>& placeholder) const;
  absl::Status Apply(const Fold& fold);
  absl::Status AddBias(const Fold& fold, const at::Tensor& bias);
  absl::Status SwitchToEval();
  void DropBatchCounts();
  // What read a folded BatchNorm's output reads its layer's: one pass over the graph.
  void ApplyRenames();
  void DropUnusedState(const std::set<std::string>& folded_keys);
  absl::StatusOr<at::Tensor> Stored(const std::string& key) const;

  const Pt2Archive& archive_;
  json program_;
  absl::StatusOr<json> weights_config_ = json();
  ArchiveEdit edit_;
  std::map<std::string, size_t> made_by_;  // tensor name -> the node that makes it
  std::map<std::string, int> reads_;       // tensor name -> how many times it is read
  std::map<std::string, StateInput> state_;  // placeholder -> the state it holds
  std::map<std::string, int> record_users_;  // record -> how many stored tensors view it
  std::set<size_t> removed_nodes_;
  std::map<std::string, std::string> renamed_;  // a folded BatchNorm's output -> its layer's
};

void ProgramFolder::ApplyRenames() {
  const auto rename = [this](json& name) {
    if (!name.is_string()) return;
    auto found = renamed_.find(name.get<std::string>());
    if (found != renamed_.end()) name = found->second;
  };
  for (json& node : nodes()) ForEachTensorRead(node["inputs"], rename);
  ForEachTensorRead(graph()["outputs"], rename);
  ForEachTensorRead(program_["graph_module"]["signature"]["output_specs"], rename);
}

void ProgramFolder::IndexGraph() {
  made_by_.clear();
  reads_.clear();
  for (size_t i = 0; i < nodes().size(); ++i) {
    if (removed_nodes_.count(i) > 0) continue;
    json& node = nodes()[i];
    ForEachTensorRead(node["outputs"], [&](const json& name) { made_by_[name.get<std::string>()] = i; });
    ForEachTensorRead(node["inputs"], [&](const json& name) { ++reads_[name.get<std::string>()]; });
  }
  ForEachTensorRead(graph()["outputs"], [&](const json& name) { ++reads_[name.get<std::string>()]; });
}

const StateInput* ProgramFolder::State(const std::optional<std::string>& placeholder) const {
  if (!placeholder) return nullptr;
  auto found = state_.find(*placeholder);
  return found == state_.end() ? nullptr : &found->second;
}

std::variant<Fold, std::string> ProgramFolder::Plan(size_t index) {
  json& bn = nodes()[index];
  Fold fold;
  fold.batch_norm_node = index;
  const StateInput* mean = State(TensorName(Argument(bn, "running_mean")));
  const StateInput* var = State(TensorName(Argument(bn, "running_var")));
  if (mean == nullptr || var == nullptr || mean->parameter || var->parameter) {
    return std::string("it has no running statistics");
  }
  fold.mean_key = mean->key;
  fold.var_key = var->key;
  fold.name = absl::StrReplaceAll(mean->key, {{".running_mean", ""}});
  if (!kFoldedForms.count(AtenOp(bn))) return absl::StrCat("its form (", AtenOp(bn), ") is not folded");
  for (auto [name, key] : {std::pair{"weight", &fold.gamma_key}, std::pair{"bias", &fold.beta_key}}) {
    json* arg = Argument(bn, name);
    if (arg == nullptr || arg->contains("as_none")) continue;
    const StateInput* state = State(TensorName(arg));
    if (state == nullptr) return absl::StrCat("its ", name, " is computed in the graph");
    *key = state->key;
  }
  const json* eps = Argument(bn, "eps");
  if (eps == nullptr || !eps->contains("as_float")) return std::string("its eps is not a constant");
  fold.eps = eps->at("as_float").get<double>();
  const std::optional<std::string> input = TensorName(Argument(bn, "input"));
  const json& outputs = bn["outputs"];
  if (!input || outputs.empty() || !TensorName(&outputs[0])) return std::string("its input or output is not a tensor");
  fold.input = *input;
  fold.output = *TensorName(&outputs[0]);
  for (size_t k = 1; k < outputs.size(); ++k) {  // the eval form's two empty outputs
    const std::optional<std::string> extra = TensorName(&outputs[k]);
    if (extra && reads_[*extra] > 0) return std::string("the graph reads its saved statistics");
  }
  return PlanLayer(index, std::move(fold));
}

std::variant<Fold, std::string> ProgramFolder::PlanLayer(size_t index, Fold fold) {
  auto maker = made_by_.find(fold.input);
  if (maker == made_by_.end()) return std::string("it normalises an input of the program, not a layer's output");
  json& layer = nodes()[maker->second];
  fold.layer_node = maker->second;
  if (!kLinearLayers.count(AtenOp(layer))) {
    const std::string op = AtenOp(layer).empty() ? layer.value("target", "?") : OpName(AtenOp(layer));
    return absl::StrCat("it follows ", op, ", not a convolution or linear layer");
  }
  if (maker->second > index) return std::string("its input is made after it");
  if (reads_[fold.input] != 1) return absl::StrCat("the output of ", OpName(AtenOp(layer)), " is also read elsewhere");
  const json* transposed = Argument(layer, "transposed");
  if (transposed != nullptr && transposed->value("as_bool", false)) return std::string("it follows a transposed convolution");
  const std::optional<std::string> weight = TensorName(Argument(layer, "weight"));
  const StateInput* weight_state = State(weight);
  if (weight_state == nullptr || !weight_state->parameter) {
    return std::string("the layer's weight is computed in the graph (a fake-quantized weight: folding would change "
                       "what is quantized; convert_pt2e folds it)");
  }
  if (reads_[*weight] != 1) return std::string("the layer's weight is shared with another layer");
  fold.weight_key = weight_state->key;
  json* bias = Argument(layer, "bias");
  if (bias != nullptr && !bias->contains("as_none")) {
    const std::optional<std::string> bias_name = TensorName(bias);
    const StateInput* bias_state = State(bias_name);
    if (bias_state == nullptr || !bias_state->parameter) return std::string("the layer's bias is computed in the graph");
    if (reads_[*bias_name] != 1) return std::string("the layer's bias is shared with another layer");
    fold.bias_key = bias_state->key;
  }
  for (const std::optional<std::string>& key : {std::optional<std::string>(fold.weight_key), fold.bias_key}) {
    const StoredTensor* stored = key ? archive_.Find(*key) : nullptr;
    if (key && (stored == nullptr || record_users_[stored->record] != 1)) {
      return absl::StrCat("'", *key, "' shares its storage with another tensor");
    }
  }
  return fold;
}

absl::StatusOr<at::Tensor> ProgramFolder::Stored(const std::string& key) const {
  const StoredTensor* stored = archive_.Find(key);
  if (stored == nullptr) return absl::InvalidArgumentError(absl::StrCat("the archive holds no '", key, "'"));
  RECAL_ASSIGN_OR_RETURN(at::Tensor tensor, archive_.Load(*stored));
  return tensor.to(at::kDouble);
}

absl::Status ProgramFolder::Apply(const Fold& fold) {
  RECAL_ASSIGN_OR_RETURN(const at::Tensor weight, Stored(fold.weight_key));
  RECAL_ASSIGN_OR_RETURN(const at::Tensor mean, Stored(fold.mean_key));
  RECAL_ASSIGN_OR_RETURN(const at::Tensor var, Stored(fold.var_key));
  const int64_t channels = weight.dim() > 0 ? weight.size(0) : 0;
  if (channels == 0 || mean.numel() != channels || var.numel() != channels) {
    return absl::InvalidArgumentError(absl::StrCat("BatchNorm '", fold.name, "' has ", mean.numel(),
                                                   " channels, its layer ", channels));
  }
  at::Tensor gamma = at::ones({channels}, weight.options());
  at::Tensor shift = at::zeros({channels}, weight.options());
  at::Tensor bias = at::zeros({channels}, weight.options());
  if (fold.gamma_key) {
    RECAL_ASSIGN_OR_RETURN(gamma, Stored(*fold.gamma_key));
  }
  if (fold.beta_key) {
    RECAL_ASSIGN_OR_RETURN(shift, Stored(*fold.beta_key));
  }
  if (fold.bias_key) {
    RECAL_ASSIGN_OR_RETURN(bias, Stored(*fold.bias_key));
  }
  const at::Tensor scale = gamma.reshape({-1}) / (var.reshape({-1}) + fold.eps).sqrt();
  std::vector<int64_t> per_channel(weight.dim(), 1);
  per_channel[0] = channels;
  edit_.values.emplace_back(fold.weight_key, weight * scale.reshape(per_channel));
  const at::Tensor folded_bias = (bias.reshape({-1}) - mean.reshape({-1})) * scale + shift.reshape({-1});
  if (fold.bias_key) {
    edit_.values.emplace_back(*fold.bias_key, folded_bias);
  } else {
    RECAL_RETURN_IF_ERROR(AddBias(fold, folded_bias));
  }
  removed_nodes_.insert(fold.batch_norm_node);
  renamed_[fold.output] = fold.input;
  for (const json& output : nodes()[fold.batch_norm_node]["outputs"]) {
    if (const std::optional<std::string> made = TensorName(&output)) graph()["tensor_values"].erase(*made);
  }
  return absl::OkStatus();
}

// A new parameter for a layer made without bias: named as torch names a layer's bias, stored
// as a new weight record, read by the layer's `bias` argument.
absl::Status ProgramFolder::AddBias(const Fold& fold, const at::Tensor& bias) {
  json& config = (*weights_config_)["config"];
  const std::string key = absl::EndsWith(fold.weight_key, "weight")
                              ? absl::StrCat(fold.weight_key.substr(0, fold.weight_key.size() - 6), "bias")
                              : absl::StrCat(fold.weight_key, "_bias");
  std::string placeholder = absl::StrCat("p_", absl::StrReplaceAll(key, {{".", "_"}}));
  while (graph()["tensor_values"].contains(placeholder) || made_by_.count(placeholder) > 0) placeholder += "_folded";
  if (archive_.Find(key) != nullptr || config.contains(key)) {
    return absl::InvalidArgumentError(absl::StrCat("the program already has a '", key, "'"));
  }
  std::string path_name;
  for (int i = 0; path_name.empty() || edit_.added_weights.count(path_name) > 0 ||
                  record_users_.count(absl::StrCat("data/weights/", path_name)) > 0; ++i) {
    path_name = absl::StrCat("weight_folded_", i);
  }
  json& layer = nodes()[fold.layer_node];
  const std::string weight_placeholder = *TensorName(Argument(layer, "weight"));
  json meta = config.at(fold.weight_key).at("tensor_meta");
  meta["sizes"] = json::array({json{{"as_int", bias.size(0)}}});
  meta["strides"] = json::array({json{{"as_int", 1}}});
  meta["storage_offset"] = json{{"as_int", 0}};
  config[key] = json{{"path_name", path_name}, {"is_param", true}, {"use_pickle", false}, {"tensor_meta", meta}};
  const StoredTensor* weight_stored = archive_.Find(fold.weight_key);
  edit_.added_weights[path_name] = bias.to(weight_stored->view.dtype).contiguous();
  graph()["tensor_values"][placeholder] = meta;
  // The new placeholder goes right after the weight's, among the parameters.
  const size_t at = state_.at(weight_placeholder).spec + 1;
  input_specs().insert(input_specs().begin() + at,
                       json{{"parameter", {{"arg", {{"name", placeholder}}}, {"parameter_name", key}}}});
  graph()["inputs"].insert(graph()["inputs"].begin() + at, json{{"as_tensor", {{"name", placeholder}}}});
  for (auto& [name, state] : state_) {
    if (state.spec >= at) ++state.spec;
  }
  state_[placeholder] = {key, true, at};
  json* bias_arg = Argument(layer, "bias");
  if (bias_arg != nullptr) {
    *bias_arg = json{{"as_tensor", {{"name", placeholder}}}};
  } else {
    json& inputs = layer["inputs"];
    size_t weight_at = 0;
    while (inputs[weight_at].value("name", "") != "weight") ++weight_at;
    json argument = inputs[weight_at];
    argument["name"] = "bias";
    argument["arg"] = json{{"as_tensor", {{"name", placeholder}}}};
    inputs.insert(inputs.begin() + weight_at + 1, argument);
  }
  return absl::OkStatus();
}

// Eval mode for what stays: BatchNorm and dropout by their `training`/`train` argument, the
// counters of batches a train-mode BatchNorm keeps no longer counted.
absl::Status ProgramFolder::SwitchToEval() {
  for (size_t i = 0; i < nodes().size(); ++i) {
    if (removed_nodes_.count(i) > 0) continue;
    json& node = nodes()[i];
    const std::string op = AtenOp(node);
    if (IsBatchNorm(op)) {
      json* training = Argument(node, "training");
      if (training != nullptr && training->value("as_bool", false)) {
        if (!kSwitchableForms.count(op)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "the program's BatchNorm node '", TensorName(&node["outputs"][0]).value_or("?"), "' (", op,
              ") trains in a form that eval mode cannot switch off: export the model in eval mode "
              "(model.eval() before torch.export.export) or without run_decompositions"));
        }
        *training = json{{"as_bool", false}};
      }
    } else if (IsDropoutOp(absl::StrCat("aten::", OpName(op)))) {
      if (json* train = Argument(node, "train")) *train = json{{"as_bool", false}};
    } else if (IsRandom(op)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the program draws random numbers (", op, ") other than dropout, stochastic depth say, which a folded "
          "model cannot switch off: export the model in eval mode (model.eval() before torch.export.export)"));
    }
  }
  DropBatchCounts();
  return absl::OkStatus();
}

// The in-place increments of num_batches_tracked (a BatchNorm called twice counts on the
// first increment's result), last first, each once nothing reads what it made.
void ProgramFolder::DropBatchCounts() {
  std::set<std::string> counters;
  std::vector<size_t> increments;
  for (const auto& [placeholder, state] : state_) {
    if (absl::EndsWith(state.key, "num_batches_tracked")) counters.insert(placeholder);
  }
  for (size_t i = 0; i < nodes().size(); ++i) {
    json& node = nodes()[i];
    const std::optional<std::string> counter = TensorName(Argument(node, "self"));
    const std::optional<std::string> made = TensorName(node["outputs"].empty() ? nullptr : &node["outputs"][0]);
    if (removed_nodes_.count(i) > 0 || AtenOp(node) != "add_.Tensor" || !counter || !counters.count(*counter) || !made) {
      continue;
    }
    counters.insert(*made);
    increments.push_back(i);
  }
  IndexGraph();
  for (auto i = increments.rbegin(); i != increments.rend(); ++i) {
    const std::string made = *TensorName(&nodes()[*i]["outputs"][0]);
    if (reads_[made] > 0) continue;
    removed_nodes_.insert(*i);
    --reads_[*TensorName(Argument(nodes()[*i], "self"))];
    graph()["tensor_values"].erase(made);
  }
}

// Removes the folded BatchNorms' parameters and buffers that nothing reads any more, from the
// signature, the graph, the weights' config and the archive.
void ProgramFolder::DropUnusedState(const std::set<std::string>& folded_keys) {
  IndexGraph();
  json& config = (*weights_config_)["config"];
  for (size_t spec = input_specs().size(); spec-- > 0;) {
    const std::optional<std::string> placeholder = TensorName(&graph()["inputs"][spec]);
    const StateInput* state = State(placeholder);
    if (state == nullptr || !folded_keys.count(state->key) || reads_[*placeholder] > 0) continue;
    const StoredTensor* stored = archive_.Find(state->key);
    if (stored == nullptr || !config.contains(state->key) || record_users_[stored->record] != 1) continue;
    edit_.dropped_records.insert(stored->record);
    config.erase(state->key);
    graph()["tensor_values"].erase(*placeholder);
    input_specs().erase(input_specs().begin() + spec);
    graph()["inputs"].erase(graph()["inputs"].begin() + spec);
  }
}

absl::StatusOr<FoldedModel> ProgramFolder::Run() {
  if (HasNestedGraph(graph()["nodes"])) {
    return absl::FailedPreconditionError(
        "the program has regions (torch.cond, autocast, activation checkpointing, no_grad blocks), which folding "
        "does not enter yet: export the model without them to fold it");
  }
  weights_config_ = archive_.WeightsConfig();
  RECAL_RETURN_IF_ERROR(weights_config_.status());
  for (const auto& [name, stored] : archive_.weights()) ++record_users_[stored.record];
  for (const auto& [name, stored] : archive_.constants()) ++record_users_[stored.record];
  // Read with at(): a const operator[] of a missing key is undefined (the fuzzer found it).
  if (!input_specs().is_array() || !graph()["inputs"].is_array() || input_specs().size() != graph()["inputs"].size()) {
    return absl::InvalidArgumentError("PT2 archive: the program's signature does not match its graph's inputs");
  }
  for (size_t spec = 0; spec < input_specs().size(); ++spec) {
    const json& entry = input_specs().at(spec);
    if (entry.contains("parameter")) {
      const json& parameter = entry.at("parameter");
      state_[parameter.at("arg").at("name").get<std::string>()] = {parameter.at("parameter_name").get<std::string>(),
                                                                   true, spec};
    } else if (entry.contains("buffer") && entry.at("buffer").value("persistent", true)) {
      const json& buffer = entry.at("buffer");
      state_[buffer.at("arg").at("name").get<std::string>()] = {buffer.at("buffer_name").get<std::string>(), false,
                                                                spec};
    }
  }
  IndexGraph();
  std::set<std::string> folded_keys;
  FoldedModel result;
  for (size_t i = 0; i < nodes().size(); ++i) {
    if (!IsBatchNorm(AtenOp(nodes()[i]))) continue;
    std::variant<Fold, std::string> planned = Plan(i);
    if (auto* reason = std::get_if<std::string>(&planned)) {
      const StateInput* mean = State(TensorName(Argument(nodes()[i], "running_mean")));
      result.kept.push_back({mean ? absl::StrReplaceAll(mean->key, {{".running_mean", ""}})
                                  : nodes()[i]["outputs"][0].dump(), *reason});
      continue;
    }
    const Fold& fold = std::get<Fold>(planned);
    // The counts of reads stay right for what later folds check: a removed BatchNorm read
    // only its own input and state, which no other fold reads.
    RECAL_RETURN_IF_ERROR(Apply(fold));
    result.folded.push_back(fold.name);
    for (const std::optional<std::string>& key : {std::optional<std::string>(fold.mean_key),
                                                  std::optional<std::string>(fold.var_key), fold.gamma_key,
                                                  fold.beta_key,
                                                  std::optional<std::string>(fold.name + ".num_batches_tracked")}) {
      if (key) folded_keys.insert(*key);
    }
  }
  if (result.folded.empty()) {
    std::vector<std::string> reasons;
    for (const KeptBatchNorm& kept : result.kept) reasons.push_back(absl::StrCat("'", kept.name, "': ", kept.reason));
    return absl::FailedPreconditionError(absl::StrCat(
        "no BatchNorm of the program directly follows a convolution or linear layer it can be folded into (",
        reasons.empty() ? "it has none" : absl::StrJoin(reasons, "; "), ")"));
  }
  ApplyRenames();
  RECAL_RETURN_IF_ERROR(SwitchToEval());
  DropUnusedState(folded_keys);
  json kept_nodes = json::array();
  for (size_t i = 0; i < nodes().size(); ++i) {
    if (removed_nodes_.count(i) == 0) kept_nodes.push_back(std::move(nodes()[i]));
  }
  nodes() = std::move(kept_nodes);
  edit_.program = std::move(program_);
  edit_.weights_config = std::move(*weights_config_);
  RECAL_ASSIGN_OR_RETURN(result.bytes, archive_.Rewritten(edit_));
  return result;
}

}  // namespace

absl::StatusOr<FoldedModel> FoldProgramBatchNorms(const Pt2Archive& archive) {
  try {
    return ProgramFolder(archive).Run();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("PT2 archive: the program cannot be folded: ", e.what()));
  } catch (const std::exception& e) {  // LibTorch's, on tensors a crafted archive shapes
    return absl::InvalidArgumentError(absl::StrCat("PT2 archive: the program cannot be folded: ", TorchErrorLine(e)));
  }
}

}  // namespace recal::engine::exported
