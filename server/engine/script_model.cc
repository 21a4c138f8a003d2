#include "server/engine/script_model.h"

#include <future>
#include <system_error>

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/script.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "server/engine/graph_rewrite.h"
#include "server/engine/run_aside.h"
#include "server/engine/script_source.h"
#include "server/engine/script_tensors.h"
#include "server/engine/torch_error.h"

namespace recal::engine {
namespace {

absl::StatusOr<torch::jit::Module> LoadModule(const std::shared_ptr<ReadAdapter>& file, const std::string& path,
                                              const c10::Device& device) {
  // Loading compiles the archive's code and, by LibTorch's default, inlines every call in
  // it: a few kB of hostile archive (f_k calls f_{k-1} twice) would make that exponential.
  // The engine inlines forward itself, once ValidateGraphs has bounded the inlined size.
  static const bool kNoInliningAtLoad = [] { return torch::jit::getInlineEverythingMode() = false; }();
  (void)kNoInliningAtLoad;
  try {
    return torch::jit::load(file, device);
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StrCat("cannot load TorchScript archive ", path), e);
  }
}

// The tensor attribute at a state_dict key ("layer1.0.bn1.running_mean") of `module`.
absl::StatusOr<at::Tensor> BufferAt(const torch::jit::Module& module, const std::string& key) {
  std::vector<std::string> parts = absl::StrSplit(key, '.');
  torch::jit::Module owner = module;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!owner.hasattr(parts[i]) || !owner.attr(parts[i]).isModule()) {
      return absl::InternalError(absl::StrCat("no submodule ", parts[i], " on the way to ", key));
    }
    owner = owner.attr(parts[i]).toModule();
  }
  if (!owner.hasattr(parts.back()) || !owner.attr(parts.back()).isTensor()) {
    return absl::InternalError(absl::StrCat("no tensor ", key, " in the model"));
  }
  return owner.attr(parts.back()).toTensor();
}

// The tensor arguments a batch can give forward, positionally: the leading ones typed Tensor
// (or Tensor?), those with a default optional. A saved TorchScript graph declares no shapes
// or dtypes (every input is plain `Tensor`, traced or scripted), so only their number is
// checked.
ModelInputs ForwardInputs(const torch::jit::Module& module) {
  ModelInputs inputs;
  const std::optional<torch::jit::Method> forward = module.find_method("forward");
  if (!forward) return inputs;
  const std::vector<c10::Argument>& arguments = forward->function().getSchema().arguments();
  for (size_t k = 1; k < arguments.size(); ++k) {  // 0 is self
    c10::TypePtr type = arguments[k].type();
    if (const auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
    if (!type->isSubtypeOf(*c10::TensorType::get())) break;
    v1::ModelInput* input = inputs.Add();
    input->set_name(arguments[k].name());
    input->set_any_shape(true);
    input->set_optional(arguments[k].default_value().has_value());
  }
  return inputs;
}

class ScriptModel final : public ObservedModel {
 public:
  ScriptModel(torch::jit::Module observed, std::shared_ptr<ReadAdapter> file, std::string path)
      : observed_(std::move(observed)), file_(std::move(file)), path_(std::move(path)), inputs_(ForwardInputs(observed_)) {
    for (const auto& buffer : observed_.named_buffers(/*recurse=*/true)) buffers_.emplace_back(buffer.name, buffer.value);
  }

  // The copy Serialize writes from, loaded on a thread of its own while the run goes on.
  void PreloadOutputCopy() {
    output_copy_ = RunAside([file = file_, path = path_] { return LoadModule(file, path, c10::Device(c10::kCPU)); }).share();
  }

  ModelFormat format() const override { return ModelFormat::kTorchScript; }
  const ModelInputs& inputs() const override { return inputs_; }
  const NamedTensors& buffers() const override { return buffers_; }

  std::vector<std::pair<at::Tensor, at::Tensor>> BatchNormBuffers() const override {
    std::vector<std::pair<at::Tensor, at::Tensor>> pairs;
    for (const auto& sub : observed_.named_modules()) {
      const torch::jit::Module& m = sub.value;
      if (m.hasattr("running_mean") && m.hasattr("running_var") && m.attr("running_mean").isTensor() &&
          m.attr("running_var").isTensor()) {
        pairs.emplace_back(m.attr("running_mean").toTensor(), m.attr("running_var").toTensor());
      }
    }
    return pairs;
  }

  absl::StatusOr<int> Observe(Collector* collector, v1::ModuleMode modules, bool end_at_last_batch_norm) override {
    if (modules == v1::EVAL) observed_.eval();
    if (modules == v1::TRAIN) observed_.train(true);
    try {
      RECAL_ASSIGN_OR_RETURN(RewriteCounts counts, InstrumentForward(observed_, reinterpret_cast<int64_t>(collector),
                                                                     modules, end_at_last_batch_norm));
      quantizers_ = counts.quantizers;
      return counts.nodes_cut;
    } catch (const std::exception& e) {
      return TorchErrorStatus("cannot instrument the model's BatchNorm layers", e);
    }
  }

  QuantizerCounts Quantizers() const override { return quantizers_; }

  // Every buffer of every fake-quantize module (torch.ao's FakeQuantizeBase: its switches,
  // scale and zero point, and its observer's range below it), found by those buffers: a
  // script module keeps no Python class to ask.
  NamedTensors QuantizerState() const override {
    NamedTensors state;
    for (const auto& sub : observed_.named_modules()) {
      const torch::jit::Module& m = sub.value;
      if (!(m.hasattr("fake_quant_enabled") && m.hasattr("observer_enabled") && m.hasattr("scale"))) continue;
      for (const auto& buffer : m.named_buffers(/*recurse=*/true)) {
        state.emplace_back(sub.name.empty() ? buffer.name : absl::StrCat(sub.name, ".", buffer.name), buffer.value);
      }
    }
    return state;
  }

  std::vector<at::Tensor> ConvolutionWeights() const override {
    std::vector<at::Tensor> weights;
    for (const at::Tensor& p : observed_.parameters()) {
      if (p.dim() == 4) weights.push_back(p);
    }
    return weights;
  }

  // In place: the graph reads parameters through the module, so every convolution finds its
  // weight in its input's layout instead of converting it on each call.
  void LayOutWeights(at::MemoryFormat format) override {
    at::NoGradGuard no_grad;
    for (at::Tensor t : observed_.parameters()) {
      if (t.dim() == 4 && !t.is_contiguous(format)) t.set_data(t.contiguous(format));
    }
  }

  void Forward(const std::vector<at::Tensor>& inputs) override {
    observed_.forward(std::vector<c10::IValue>(inputs.begin(), inputs.end()));
  }

  absl::StatusOr<std::string> Serialize(const NamedTensors& buffers) const override;
  absl::Status CheckReloads(absl::string_view bytes, const NamedTensors& buffers) const override;

 private:
  torch::jit::Module observed_;
  std::shared_ptr<ReadAdapter> file_;
  std::string path_;
  const ModelInputs inputs_;
  NamedTensors buffers_;
  QuantizerCounts quantizers_;
  std::shared_future<absl::StatusOr<torch::jit::Module>> output_copy_;
};

absl::StatusOr<std::string> ScriptModel::Serialize(const NamedTensors& buffers) const {
  // A never rewritten copy: the observed one calls recal:: operators that nobody else can
  // load, and clone() would share its compilation unit. Usually loaded beside the run.
  absl::StatusOr<torch::jit::Module> target =
      output_copy_.valid() ? output_copy_.get() : LoadModule(file_, path_, c10::Device(c10::kCPU));
  if (!target.ok()) return target.status();
  {
    at::NoGradGuard no_grad;
    for (const auto& [key, value] : buffers) {
      RECAL_ASSIGN_OR_RETURN(at::Tensor buffer, BufferAt(*target, key));
      buffer.copy_(value);
    }
  }
  std::vector<std::string> recal_ops = RecalOpsIn(*target);
  if (!recal_ops.empty()) {
    return absl::InternalError(absl::StrCat("refusing to save a model that calls ", absl::StrJoin(recal_ops, ", ")));
  }
  std::string bytes;
  bytes.reserve(file_->size());
  try {
    torch::jit::ExportModule(*target, [&bytes](const void* data, size_t n) {
      bytes.append(static_cast<const char*>(data), n);
      return n;
    });
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("the recalibrated model does not save: ", TorchErrorLine(e)));
  }
  return bytes;
}

absl::Status ScriptModel::CheckReloads(absl::string_view bytes, const NamedTensors& buffers) const {
  try {
    torch::jit::Module reloaded = torch::jit::load(BytesReader(bytes));
    for (const auto& [key, value] : buffers) {
      auto buffer = BufferAt(reloaded, key);
      if (!buffer.ok() || !buffer->equal(value)) {
        return absl::InternalError(absl::StrCat("the saved model does not hold the new ", key));
      }
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("the recalibrated model does not reload: ", TorchErrorLine(e)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ObservedModel>> LoadScriptModel(std::shared_ptr<ReadAdapter> file,
                                                                const std::string& path, const LoadOptions& options) {
  // Before LibTorch compiles the code or makes any tensor of the archive (the output copy is
  // loaded from the same bytes).
  RECAL_RETURN_IF_ERROR(CheckScriptSource(file, options.graph_policy));
  RECAL_RETURN_IF_ERROR(CheckScriptTensors(file));
  RECAL_ASSIGN_OR_RETURN(torch::jit::Module module, LoadModule(file, path, options.device));
  RECAL_RETURN_IF_ERROR(ValidateGraphs(module, options.graph_policy));
  auto model = std::make_unique<ScriptModel>(std::move(module), std::move(file), path);
  if (options.preload_output_copy) model->PreloadOutputCopy();
  return std::unique_ptr<ObservedModel>(std::move(model));
}

}  // namespace recal::engine
