#include "server/engine/recalibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <future>
#include <regex>
#include <unordered_map>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Event.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "common/data_spec.h"
#include "common/request_limits.h"
#include "common/formats/safetensors.h"
#include "server/engine/autocast_scope.h"
#include "server/engine/collector.h"
#include "server/engine/devices.h"
#include "server/engine/report.h"
#include "server/engine/run_aside.h"
#include "server/engine/torch_error.h"

namespace recal::engine {
namespace {

absl::StatusOr<c10::Device> ParseDevice(const std::string& name) {
  try {
    c10::Device device(name);
    // Said here, not at the first CUDA call deep in loading: a CUDA LibTorch on a machine
    // without a GPU (or its driver) sees none, as a CPU-only build does.
    const absl::StatusOr<int> count = device.is_cuda() ? CudaDeviceCount() : 0;
    if (!count.ok()) return count.status();
    const int visible = *count;
    if (device.is_cuda() && (visible == 0 || device.index() >= visible)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device ", name, " requested, but LibTorch sees ", visible, " CUDA device(s)",
          visible == 0 ? absl::StrCat(" (no GPU or driver here, or a LibTorch built without CUDA; ", CudaDriverStatus(), ")")
                       : ""));
    }
    if (!device.is_cpu() && !device.is_cuda()) {
      return absl::InvalidArgumentError(absl::StrCat("device ", name, ": use cpu or cuda:N"));
    }
    return device;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad device '", name, "': use cpu or cuda:N"));
  }
}

absl::StatusOr<std::function<bool(const std::string&)>> LayerFilter(const Options& options) {
  try {
    auto include = std::make_shared<std::regex>(options.include);
    auto exclude = std::make_shared<std::regex>(options.exclude);
    const bool any_include = !options.include.empty();
    const bool any_exclude = !options.exclude.empty();
    return [=](const std::string& name) {
      return (!any_include || std::regex_search(name, *include)) &&
             !(any_exclude && std::regex_search(name, *exclude));
    };
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad --include/--exclude expression: ", e.what()));
  }
}

// The model's 2-d convolutions (4-d weights), which a channels-last layout speeds up:
// oneDNN runs them on NHWC activations and weights as they are, where contiguous (NCHW) ones
// are reordered to its blocked layout and back on every call; and whether some of them are
// depthwise (one input channel per group), which oneDNN's NCHW path does worst.
struct Convolutions {
  bool any = false;
  bool depthwise = false;
};

Convolutions ConvolutionsOf(const ObservedModel& model) {
  Convolutions found;
  for (const at::Tensor& p : model.ConvolutionWeights()) {
    found.any = true;
    found.depthwise |= p.size(1) == 1 && p.size(2) * p.size(3) > 1;
  }
  return found;
}

// Channels-last where bench/forward_levers measured it faster on CPU (1 thread, medians of
// interleaved repetitions, forward time channels-last / contiguous). Depthwise models
// (MobileNetV2): 0.53-0.63 at batch 32 from 32x32 to 112x112 images, 0.94-1.05 at batch 1-8.
// Dense ones (ResNet-18): 0.71-0.87 from 112x112 up at any batch, but 0.96-1.14 on smaller
// images. oneDNN's channels-last kernels are float32 only here; CUDA is not measured yet.
// Deterministic on purpose: the layout changes the float32 rounding of the forward, and runs
// with the same data and options give bit-identical statistics.
MemoryFormat AutoMemoryFormat(const c10::Device& device, const std::vector<at::Tensor>& inputs,
                              const ObservedModel& model) {
  constexpr int64_t kDenseMinPixels = 112 * 112;
  if (!device.is_cpu()) return MemoryFormat::kContiguous;
  auto image = std::find_if(inputs.begin(), inputs.end(), [](const at::Tensor& t) {
    return t.dim() == 4 && t.scalar_type() == at::kFloat;
  });
  if (image == inputs.end()) return MemoryFormat::kContiguous;
  const Convolutions convolutions = ConvolutionsOf(model);
  const bool faster = convolutions.depthwise ||
                      (convolutions.any && image->size(2) * image->size(3) >= kDenseMinPixels);
  return faster ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Why a forward failed when the data's floating dtype is not the model's (float64 data for a
// float32 model fails deep in a convolution as "expected scalar type Double but found
// Float"): both dtypes and the conversion that fixes it; empty when the dtypes agree.
std::string DtypeMismatch(const std::vector<at::Tensor>& args, const ObservedModel& model) {
  const auto buffers = model.BatchNormBuffers();
  if (buffers.empty()) return "";
  const at::ScalarType model_dtype = buffers.front().first.scalar_type();
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].defined() || !args[i].is_floating_point() || args[i].scalar_type() == model_dtype) continue;
    // torch's Python names: "float64", "float32".
    const std::string data(c10::getDtypeNames(args[i].scalar_type()).first);
    const std::string wanted(c10::getDtypeNames(model_dtype).first);
    return absl::StrCat("input ", i, " is ", data, " but the model computes in ", wanted, ": convert the data to ",
                        wanted, " (numpy: x.astype(np.", wanted, "); torch: x.to(torch.", wanted,
                        ")) or save the model in ", data, " (model.to(torch.", data, ")) before exporting it");
  }
  return "";
}

// The largest value of `values`, 0 when there is none.
double MaxOf(const at::Tensor& values) { return values.numel() > 0 ? values.max().item<double>() : 0.0; }

// `parts` (float64, 1-d) on the host, in one copy: a progress tick's one host synchronisation.
absl::StatusOr<std::vector<double>> ToHost(const std::vector<at::Tensor>& parts) {
  if (parts.empty()) return std::vector<double>();
  try {
    std::vector<at::Tensor> on_one_device;
    for (const at::Tensor& part : parts) on_one_device.push_back(part.to(parts.front().device()));
    const at::Tensor all = at::cat(on_one_device).cpu().contiguous();
    return std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
  } catch (const std::exception& e) {
    // A kernel's failure since the last tick surfaces here, where the host waits for it.
    return TorchErrorStatus("reading the batches' checks from the device", e);
  }
}

// A stream of the GPU's pool for copying batches to `device`; none on the CPU.
absl::StatusOr<std::optional<c10::Stream>> CopyStream(const c10::Device& device) {
  if (!device.is_cuda()) return std::nullopt;
  try {
    return c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StrCat("a copy stream on ", device.str()), e);
  }
}

// `input`, pinned host memory, copied to `device` on `copy` rather than on the stream the
// forward runs on: between progress ticks the host runs ahead of the GPU, so this copy runs
// while the GPU still computes the batch before, where on the compute stream it would wait
// for it. The compute stream waits for the copy (an event); record_stream tells the caching
// allocator that the compute stream uses the tensor, so that its memory, allocated on the
// copy stream, is not handed out again before the forward has read it. The pinned source is
// kept by the caching host allocator until the copy stream has copied it.
at::Tensor CopyOnStream(const at::Tensor& input, const c10::Device& device, const c10::Stream& copy) {
  const c10::Stream compute = c10::impl::VirtualGuardImpl(device.type()).getStream(device);
  at::Tensor arg;
  {
    c10::StreamGuard on_copy_stream(copy);
    arg = input.to(device, /*non_blocking=*/true);
  }
  c10::Event copied(device.type());
  copied.record(copy);
  copied.block(compute);
  arg.record_stream(compute);
  return arg;
}

}  // namespace

Options ShardOptions(Options options, int shards, int64_t batches) {
  options.max_batches = batches;
  options.allow_short_data = true;  // a client's stream decides where its shard ends
  options.target_rel_error *= std::sqrt(static_cast<double>(shards));
  return options;
}

Recalibration::Recalibration(std::string model_path, Options options)
    : model_path_(std::move(model_path)), options_(std::move(options)) {}

Recalibration::~Recalibration() = default;

absl::StatusOr<std::unique_ptr<Recalibration>> Recalibration::Create(const std::string& model_path,
                                                                     const Options& options) {
  auto device = ParseDevice(options.device);
  if (!device.ok()) return device.status();
  auto included = LayerFilter(options);
  if (!included.ok()) return included.status();
  if (options.max_batches && *options.max_batches < 1) {
    return absl::InvalidArgumentError("max_batches must be at least 1");
  }
  if (options.target_rel_error < 0) {
    return absl::InvalidArgumentError("target_rel_error must not be negative");
  }
  if (options.progress_tick_batches < 0) {
    return absl::InvalidArgumentError("progress_tick_batches must not be negative (0: the device's default)");
  }
  if (options.iterations < 1 || options.iterations > limits::kMaxIterations) {
    return absl::InvalidArgumentError(
        absl::StrCat("iterations must be 1 to ", limits::kMaxIterations, " (passes over the data)"));
  }
  if (options.threads > 0) at::set_num_threads(options.threads);

  std::unique_ptr<Recalibration> run(new Recalibration(model_path, options));
  run->device_ = *device;
  run->tick_batches_ = ProgressTickBatches(options, device->is_cpu());
  RECAL_ASSIGN_OR_RETURN(run->copy_stream_, CopyStream(*device));
  auto model = LoadObservedModel(model_path, {*device, options.graph_policy, options.preload_output_copy});
  if (!model.ok()) return model.status();
  run->model_ = std::move(*model);
  std::unordered_map<const void*, std::string> buffer_names;
  for (const auto& [name, buffer] : run->model_->buffers()) {
    buffer_names.emplace(buffer.data_ptr(), name);
    run->buffers_.emplace(name, buffer);
  }
  run->collector_ = std::make_unique<Collector>(std::move(buffer_names), *included);
  for (const auto& [mean, var] : run->model_->BatchNormBuffers()) run->collector_->DeclareLayer(mean, var);
  for (const auto& layer : run->collector_->layers()) {
    for (const std::string& key : {layer->mean_key, layer->var_key}) {
      if (auto buffer = run->Buffer(key); buffer.ok()) run->uploaded_.emplace(key, buffer->clone());
    }
  }
  if (options.memory_format != MemoryFormat::kAuto) run->SetMemoryFormat(options.memory_format);
  auto cut = run->model_->Observe(run->collector_.get(), options.modules, options.end_at_last_batch_norm);
  if (!cut.ok()) return cut.status();
  run->forward_nodes_cut_ = *cut;
  for (const auto& [key, tensor] : run->model_->QuantizerState()) run->quantizer_state_.emplace_back(key, tensor.clone());
  return run;
}

absl::Status Recalibration::Feed(const std::vector<at::Tensor>& inputs) {
  return FeedBatch(inputs, /*want_error=*/false).status();
}

absl::StatusOr<std::optional<double>> Recalibration::FeedBatch(const std::vector<at::Tensor>& inputs,
                                                               bool want_error) {
  const auto start = std::chrono::steady_clock::now();
  held_args_.clear();  // the batch before's: its tick has passed, or never comes for it now
  if (inputs.empty() || inputs[0].dim() == 0) {
    return absl::InvalidArgumentError("a batch needs at least one input with a batch dimension");
  }
  if (inputs[0].size(0) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", batches_, " has no samples"));
  }
  if (absl::Status fits = CheckInputs(inputs); !fits.ok()) return fits;
  std::vector<at::Tensor> args;
  if (memory_format_ == MemoryFormat::kAuto) {
    RECAL_RETURN_IF_ERROR(FirstForward(inputs, args));
  } else {
    RECAL_ASSIGN_OR_RETURN(args, Arguments(inputs));
    RECAL_RETURN_IF_ERROR(Forward(args, batches_));
  }
  collector_->EndBatch();
  held_args_ = std::move(args);
  tick_pending_ = true;
  ++batches_;
  samples_ += inputs[0].size(0);
  // The point is taken now, on the device; the tick reads it. Every batch for the first 128,
  // ever more rarely after.
  if (convergence_.Wants(batches_)) pending_points_.push_back({batches_, samples_, LayerRelStdErrorTensor()});
  std::optional<double> error;
  if (TickDue()) {
    RECAL_ASSIGN_OR_RETURN(error, ReadTick(want_error));
  }
  // An observer inside the graph moves at the first batch if it moves at all.
  if (batches_ == 1 && pass_ == 1) RECAL_RETURN_IF_ERROR(CheckQuantizersHeld());
  seconds_ += Seconds(start);
  return error;
}

bool Recalibration::TickDue() const {
  return batches_ == 1 || batches_ % tick_batches_ == 0 ||
         batches_ >= options_.max_batches.value_or(kDefaultMaxBatches);
}

absl::Status Recalibration::Tick() { return TickIfPending(/*want_error=*/false).status(); }

absl::StatusOr<std::optional<double>> Recalibration::TickIfPending(bool want_error) {
  if (!tick_pending_) return std::nullopt;
  const auto start = std::chrono::steady_clock::now();
  RECAL_ASSIGN_OR_RETURN(const double error, ReadTick(want_error));
  seconds_ += Seconds(start);
  return error;
}

absl::StatusOr<double> Recalibration::ReadTick(bool want_error) {
  tick_pending_ = false;
  const std::vector<BatchFlags> flags = collector_->TakeBatchFlags();
  const std::vector<PendingPoint> points = std::exchange(pending_points_, {});
  at::Tensor now;  // the layers' errors after the last batch: its point's, if it has one
  if (want_error) {
    now = !points.empty() && points.back().batches == batches_ ? points.back().errors : LayerRelStdErrorTensor();
  }
  std::vector<at::Tensor> parts;
  for (const BatchFlags& batch : flags) {
    if (batch.flags.defined()) parts.push_back(batch.flags);
  }
  for (const PendingPoint& point : points) {
    if (point.errors.defined()) parts.push_back(point.errors);
  }
  if (now.defined()) parts.push_back(now);
  RECAL_ASSIGN_OR_RETURN(const std::vector<double> host, ToHost(parts));
  const double* next = host.data();
  for (const BatchFlags& batch : flags) {
    if (!batch.flags.defined()) continue;
    for (size_t i = 0; i < batch.layers.size(); ++i) {
      if (next[i] != 0) return NonFiniteError(batch, i);
    }
    next += batch.layers.size();
  }
  for (const PendingPoint& point : points) {
    const int64_t n = point.errors.defined() ? point.errors.numel() : 0;
    if (auto added = ConvergencePointOf(point.batches, point.samples, std::vector<double>(next, next + n))) {
      convergence_.Add(*added);  // it keeps the same points as a tick after every batch would
    }
    next += n;
  }
  held_args_.clear();
  const int64_t n = now.defined() ? now.numel() : 0;
  return n == 0 ? 0.0 : *std::max_element(next, next + n);
}

absl::Status Recalibration::NonFiniteError(const BatchFlags& batch, size_t layer) {
  const std::string what = absl::StrCat("the batch statistics of BatchNorm layer '", batch.layers[layer]->name,
                                        "' in batch ", batch.batch, " are not finite (NaN or Inf in its input)");
  if (batch.batch != batches_ - 1 || held_args_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, "; found by the check after batch ", batches_ - 1, " (on this device the statistics are checked every ",
        tick_batches_, " batches), when batch ", batch.batch, "'s inputs were no longer held to say where in them"));
  }
  // Checking every call's input at once would cost a host sync per call on every batch;
  // the failed batch alone runs again to say where the first NaN or Inf is.
  collector_->set_locate_nonfinite(true);
  absl::Status again = Forward(held_args_, batch.batch);
  const std::string location = collector_->nonfinite_location();
  collector_->set_locate_nonfinite(false);
  return absl::InvalidArgumentError(again.ok() && !location.empty() ? location : what);
}

absl::Status Recalibration::CheckInputs(const std::vector<at::Tensor>& inputs) const {
  std::vector<TensorShape> batch;
  for (const at::Tensor& input : inputs) {
    batch.push_back({input.sizes().vec(), std::string(c10::getDtypeNames(input.scalar_type()).first)});
  }
  const absl::Status fits = CheckBatch(model_->inputs(), batch);
  if (fits.ok()) return fits;
  return absl::InvalidArgumentError(absl::StrCat("batch ", batches_, ": ", fits.message()));
}

absl::StatusOr<std::vector<at::Tensor>> Recalibration::Arguments(const std::vector<at::Tensor>& inputs) const {
  std::vector<at::Tensor> args;
  args.reserve(inputs.size());
  try {
    for (const at::Tensor& input : inputs) {
      // Pinned batches (the input pipeline pins them for CUDA) copy without blocking the
      // host; the caching host allocator keeps their memory until the copy is done.
      at::Tensor arg = copy_stream_ && input.is_pinned() ? CopyOnStream(input, device_, *copy_stream_)
                                                         : input.to(device_);
      if (memory_format_ == MemoryFormat::kChannelsLast && arg.dim() == 4 && arg.is_floating_point()) {
        arg = arg.contiguous(at::MemoryFormat::ChannelsLast);
      }
      args.emplace_back(std::move(arg));
    }
  } catch (const std::exception& e) {
    return TorchErrorStatus(absl::StrCat("copying batch ", batches_, " to ", device_.str()), e);
  }
  return args;
}

void Recalibration::SetMemoryFormat(MemoryFormat format) {
  memory_format_ = format;
  model_->LayOutWeights(format == MemoryFormat::kChannelsLast ? at::MemoryFormat::ChannelsLast
                                                              : at::MemoryFormat::Contiguous);
}

absl::Status Recalibration::FirstForward(const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& args) {
  SetMemoryFormat(AutoMemoryFormat(device_, inputs, *model_));
  RECAL_ASSIGN_OR_RETURN(args, Arguments(inputs));
  absl::Status forward = Forward(args, batches_);
  if (forward.ok() || memory_format_ == MemoryFormat::kContiguous) return forward;
  // Code that views activations as contiguous (x.view(n, -1) on (N, C, H, W)) fails
  // channels-last: what auto picks must not fail a model that runs as it was saved.
  collector_->ResetStatistics();
  SetMemoryFormat(MemoryFormat::kContiguous);
  RECAL_ASSIGN_OR_RETURN(args, Arguments(inputs));
  return Forward(args, batches_);
}

absl::Status Recalibration::Forward(const std::vector<at::Tensor>& args, int64_t batch) {
  collector_->BeginBatch(batch);
  try {
    // Inference mode also skips the version counters and view tracking that no-grad keeps
    // for every tensor the forward makes; the accumulators stay ordinary tensors (Moments).
    c10::InferenceMode inference(options_.inference_mode);
    at::NoGradGuard no_grad;
    std::optional<AutocastScope> autocast;
    if (options_.compute_dtype != ComputeDtype::kFloat32) {
      autocast.emplace(device_.type(), /*enabled=*/true,
                       options_.compute_dtype == ComputeDtype::kBFloat16 ? at::kBFloat16 : at::kHalf);
    }
    model_->Forward(args);
  } catch (const std::exception& e) {
    const std::string mismatch = DtypeMismatch(args, *model_);
    return TorchErrorStatus(absl::StrCat("forward failed on batch ", batch, mismatch.empty() ? "" : ": ", mismatch),
                            e);
  }
  return absl::OkStatus();
}

at::Tensor Recalibration::LayerRelStdErrorTensor() const {
  std::vector<at::Tensor> errors;
  for (const auto& layer : collector_->layers()) {
    if (layer->stats.samples() > 0) errors.push_back(layer->stats.RelStdErrorTensor().view({1}));
  }
  return errors.empty() ? at::Tensor() : at::cat(errors);
}

std::vector<double> Recalibration::LayerRelStdErrors() const {
  const at::Tensor errors = LayerRelStdErrorTensor();
  if (!errors.defined()) return {};
  const at::Tensor all = errors.cpu().contiguous();  // one host sync
  return std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
}

double Recalibration::RelStdError() const {
  const std::vector<double> errors = LayerRelStdErrors();
  return errors.empty() ? 0 : *std::max_element(errors.begin(), errors.end());
}

std::optional<v1::ConvergencePoint> Recalibration::CurrentConvergencePoint() const {
  return ConvergencePointOf(batches_, samples_, LayerRelStdErrors());
}

absl::Status Recalibration::Run(const NextBatchFn& next_batch,
                                const std::function<void(const Progress&)>& on_progress,
                                const std::atomic<bool>* cancelled) {
  if (absl::Status fed = RunShard(next_batch, on_progress, cancelled); !fed.ok()) return fed;
  return Finish();
}

absl::Status Recalibration::RunPasses(const OpenPassFn& open_pass,
                                      const std::function<void(const Progress&)>& on_progress,
                                      const std::atomic<bool>* cancelled) {
  int64_t earlier_batches = 0, earlier_samples = 0;
  std::function<void(const Progress&)> progress;
  if (on_progress) {
    progress = [&](const Progress& p) {
      Progress all = p;
      all.batches += earlier_batches;
      all.samples += earlier_samples;
      all.max_batches = p.max_batches * options_.iterations;
      on_progress(all);
    };
  }
  for (int pass = 1; pass <= options_.iterations; ++pass) {
    if (pass > 1) {
      earlier_batches += batches_;
      earlier_samples += samples_;
      RECAL_RETURN_IF_ERROR(NextPass());
    }
    RECAL_ASSIGN_OR_RETURN(NextBatchFn next, open_pass());
    RECAL_RETURN_IF_ERROR(Run(next, progress, cancelled));
  }
  return absl::OkStatus();
}

absl::Status Recalibration::NextPass() {
  RECAL_RETURN_IF_ERROR(Finish());
  iteration_steps_.push_back(PassMovement());
  {
    at::NoGradGuard no_grad;
    for (const auto& layer : collector_->layers()) {
      if (!layer->stats.has_estimate(options_.estimator)) continue;
      RECAL_ASSIGN_OR_RETURN(at::Tensor mean, Buffer(layer->mean_key));
      RECAL_ASSIGN_OR_RETURN(at::Tensor var, Buffer(layer->var_key));
      mean.copy_(layer->stats.mean(options_.estimator));
      var.copy_(layer->stats.var(options_.estimator));
    }
  }
  collector_->ResetStatistics();
  tick_pending_ = false;
  pending_points_.clear();
  held_args_.clear();
  ++pass_;
  batches_ = samples_ = 0;
  seconds_ = 0;
  stopped_early_ = false;
  convergence_ = ConvergenceHistory();
  return absl::OkStatus();
}

v1::IterationStep Recalibration::PassMovement() const {
  v1::IterationStep step;
  step.set_iteration(pass_);
  double worst = -1;
  for (const auto& layer : collector_->layers()) {
    auto previous_mean = Buffer(layer->mean_key);
    auto previous_var = Buffer(layer->var_key);
    if (!layer->stats.has_estimate(options_.estimator) || !previous_mean.ok() || !previous_var.ok()) continue;
    const at::Tensor mean = layer->stats.mean(options_.estimator).cpu();
    const at::Tensor var = layer->stats.var(options_.estimator).cpu();
    const at::Tensor live = var > 0;
    const double shift = MaxOf(((mean - previous_mean->to(at::kDouble).cpu()).abs() / var.sqrt()).masked_select(live));
    const double change = MaxOf((var / previous_var->to(at::kDouble).cpu() - 1).abs().masked_select(live));
    step.set_max_mean_shift_in_std(std::max(step.max_mean_shift_in_std(), shift));
    step.set_max_var_change(std::max(step.max_var_change(), change));
    if (std::max(shift, change) > worst) {
      worst = std::max(shift, change);
      step.set_worst_layer(layer->name);
    }
  }
  return step;
}

absl::Status Recalibration::CheckQuantizersHeld() const {
  std::map<std::string, at::Tensor> now;
  for (const auto& [key, tensor] : model_->QuantizerState()) now.emplace(key, tensor);
  for (const auto& [key, held] : quantizer_state_) {
    auto found = now.find(key);
    if (found != now.end() && found->second.equal(held)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's quantizer state '", key, "' changed during the forward: an observer runs inside the model's "
        "graph (a traced torch.ao FakeQuantize records its observer's updates), and Recal re-estimates BatchNorm "
        "with every quantizer fixed, as the model holds it. Export the model with torch.export (its "
        "fused_moving_avg_obs_fake_quant quantizers run with their observers held still), or trace it after "
        "torch.ao.quantization.disable_observer"));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> Recalibration::Uploaded(const std::string& key) const {
  auto found = uploaded_.find(key);
  if (found == uploaded_.end()) return Buffer(key);
  return found->second;
}

absl::Status Recalibration::RunShard(const NextBatchFn& next_batch,
                                     const std::function<void(const Progress&)>& on_progress,
                                     const std::atomic<bool>* cancelled) {
  const int64_t limit = options_.max_batches.value_or(kDefaultMaxBatches);
  const bool check_precision = options_.target_rel_error > 0;
  const bool want_error = check_precision || on_progress != nullptr;
  while (batches_ < limit) {
    if (cancelled && cancelled->load()) return absl::CancelledError("cancelled");
    auto batch = next_batch();
    if (!batch.ok()) return batch.status();
    // Progress and the precision target are judged at progress ticks only (on a GPU every
    // few batches): a batch that ticks, or the end of the data after one that did not.
    std::optional<double> error;
    if (*batch) {
      RECAL_ASSIGN_OR_RETURN(error, FeedBatch(**batch, want_error));
    } else {
      RECAL_ASSIGN_OR_RETURN(error, TickIfPending(want_error));
    }
    if (error && on_progress) on_progress({batches_, samples_, limit, seconds_, *error});
    if (error && check_precision && batches_ >= options_.min_batches_for_target &&
        *error <= options_.target_rel_error) {
      stopped_early_ = batches_ < limit;
      break;
    }
    if (!*batch) {
      if (options_.max_batches && !options_.allow_short_data) {
        return data::ShortDataError(batches_, samples_, limit);
      }
      break;
    }
  }
  return absl::OkStatus();
}

ShardStatistics Recalibration::Statistics() const {
  ShardStatistics statistics;
  statistics.batches = batches_;
  statistics.samples = samples_;
  statistics.seconds = seconds_;
  statistics.stopped_early = stopped_early_;
  statistics.memory_format = memory_format_;
  for (const auto& layer : collector_->layers()) {
    statistics.layers.push_back({layer->mean_key, layer->var_key, layer->calls, layer->refined_calls, layer->stats});
  }
  return statistics;
}

absl::Status Recalibration::Merge(const ShardStatistics& shard) {
  for (const LayerTally& tally : shard.layers) {
    Layer* target = nullptr;
    for (const auto& layer : collector_->layers()) {
      if (layer->mean_key == tally.mean_key) target = layer.get();
    }
    if (target == nullptr) {  // a functional BatchNorm the shard met and this run has not
      auto mean = Buffer(tally.mean_key);
      auto var = Buffer(tally.var_key);
      if (mean.ok() && var.ok()) collector_->DeclareLayer(*mean, *var);
      for (const auto& layer : collector_->layers()) {
        if (layer->mean_key == tally.mean_key) target = layer.get();
      }
    }
    if (target == nullptr || target->var_key != tally.var_key) {
      return absl::InvalidArgumentError(absl::StrCat("the shard's layer with buffers ", tally.mean_key, " / ",
                                                     tally.var_key, " is not a BatchNorm layer of this model"));
    }
    target->calls += tally.calls;
    target->refined_calls += tally.refined_calls;
    target->stats.Merge(tally.stats);
  }
  // The report names the layout the batches ran in: the shards' where they agree, "auto"
  // where auto chose differently in them (say, shards on different devices).
  if (shard.batches > 0) {
    memory_format_ = batches_ == 0 || memory_format_ == shard.memory_format ? shard.memory_format : MemoryFormat::kAuto;
  }
  // The merged statistics did not grow in one order of batches: a history would show one
  // shard's, then a jump.
  convergence_.Abandon();
  batches_ += shard.batches;
  samples_ += shard.samples;
  seconds_ += shard.seconds;
  stopped_early_ = stopped_early_ || shard.stopped_early;
  return absl::OkStatus();
}

absl::Status Recalibration::Finish() const {
  if (batches_ == 0) return absl::InvalidArgumentError("the data has no samples");
  bool any_ran = false, any_recalibrated = false;
  for (const auto& layer : collector_->layers()) {
    any_ran |= layer->calls > 0;
    any_recalibrated |= layer->stats.calls() > 0;
  }
  if (!any_ran) {
    return absl::InvalidArgumentError(
        "no BatchNorm layer with running statistics ran in any forward pass");
  }
  if (!any_recalibrated) {
    return absl::InvalidArgumentError("every BatchNorm layer that ran is left out by include/exclude");
  }
  RECAL_RETURN_IF_ERROR(CheckQuantizersHeld());
  return CheckStatisticsFitBuffers();
}

absl::Status Recalibration::CheckStatisticsFitBuffers() const {
  // Finite float64 statistics of finite activations can still exceed float32 (|x| ~ 1e20
  // squares past 3.4e38): a saved Inf would poison every later forward.
  for (const auto& layer : collector_->layers()) {
    if (!layer->stats.has_estimate(options_.estimator)) continue;
    auto buffer = Buffer(layer->var_key);
    if (!buffer.ok()) continue;
    const at::Tensor var = layer->stats.var(options_.estimator);
    const at::Tensor mean = layer->stats.mean(options_.estimator);
    if (!at::isfinite(var.to(buffer->scalar_type())).all().item<bool>() ||
        !at::isfinite(mean.to(buffer->scalar_type())).all().item<bool>()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the new statistics of BatchNorm layer '", layer->name, "' (variance up to ",
          var.max().item<double>(), ") do not fit its ", std::string(buffer->dtype().name()),
          " buffers"));
    }
  }
  return absl::OkStatus();
}

NamedTensors Recalibration::FinalBuffers() const {
  NamedTensors buffers;
  for (const auto& layer : collector_->layers()) {
    auto old_mean = Uploaded(layer->mean_key);
    auto old_var = Uploaded(layer->var_key);
    if (!old_mean.ok() || !old_var.ok()) continue;
    if (!layer->stats.has_estimate(options_.estimator)) {  // excluded, unused or never measured
      buffers.emplace_back(layer->mean_key, old_mean->cpu());
      buffers.emplace_back(layer->var_key, old_var->cpu());
    } else {
      buffers.emplace_back(layer->mean_key,
                           layer->stats.mean(options_.estimator).to(old_mean->scalar_type()).cpu());
      buffers.emplace_back(layer->var_key,
                           layer->stats.var(options_.estimator).to(old_var->scalar_type()).cpu());
    }
  }
  return buffers;
}

absl::Status Recalibration::WriteModel(const std::string& path) const {
  const NamedTensors buffers = FinalBuffers();
  auto bytes = model_->Serialize(buffers);
  if (!bytes.ok()) return bytes.status();
  // The reload check runs beside the write of the temporary file; the file takes its final
  // name only after both, and only if the check passed.
  std::future<absl::Status> reloaded =
      RunAside([this, &bytes, &buffers] { return model_->CheckReloads(*bytes, buffers); });
  auto writer = AtomicFileWriter::Open(path);
  const absl::Status appended = writer.ok() ? writer->Append(*bytes) : writer.status();
  if (absl::Status check = reloaded.get(); !check.ok()) return check;
  if (!appended.ok()) return appended;
  return writer->Commit();
}

absl::Status Recalibration::WriteBatchNormBuffers(const std::string& path) const {
  NamedTensors buffers = FinalBuffers();
  std::vector<formats::SafetensorsEntry> entries;
  for (auto& [key, value] : buffers) {
    value = value.contiguous();
    // Running statistics are floating point; write them in their own precision.
    const char* dtype = value.scalar_type() == at::kDouble ? "F64"
                        : value.scalar_type() == at::kHalf ? "F16"
                        : value.scalar_type() == at::kBFloat16 ? "BF16" : "F32";
    if (value.scalar_type() != at::kFloat && std::string(dtype) == "F32") value = value.to(at::kFloat);
    entries.push_back({key, dtype, value.sizes().vec(),
                       absl::string_view(static_cast<const char*>(value.data_ptr()),
                                         value.numel() * value.element_size())});
  }
  return formats::WriteSafetensors(path, entries, {{"format", "pt"}, {"producer", "recal"}});
}

std::vector<DeclaredLayer> Recalibration::Layers() const {
  std::vector<DeclaredLayer> layers;
  for (const auto& layer : collector_->layers()) {
    layers.push_back({layer->name, layer->mean_key, layer->var_key, layer->channels});
  }
  return layers;
}

absl::StatusOr<at::Tensor> Recalibration::Buffer(const std::string& key) const {
  auto found = buffers_.find(key);
  if (found == buffers_.end()) return absl::InternalError(absl::StrCat("no buffer ", key, " in the model"));
  return found->second;
}

absl::StatusOr<ModelInspection> InspectModel(const std::string& path, const GraphPolicy& policy) {
  Options options;
  options.graph_policy = policy;
  options.preload_output_copy = false;
  auto run = Recalibration::Create(path, options);
  if (!run.ok()) return run.status();
  return ModelInspection{(*run)->Layers(), (*run)->inputs()};
}

v1::RunReport Recalibration::Report() const {
  v1::RunReport report;
  report.set_model(model_path_);
  report.set_model_format(ModelFormatName(model_->format()));
  report.set_estimator(options_.estimator);
  report.set_modules(options_.modules);
  report.set_device(options_.device);
  report.set_batches(batches_);
  report.set_samples(samples_);
  report.set_stopped_early(stopped_early_);
  report.set_seconds(seconds_);
  report.set_samples_per_second(seconds_ > 0 ? samples_ / seconds_ : 0);
  report.set_memory_format(MemoryFormatName(memory_format_));
  report.set_compute_dtype(ComputeDtypeName(options_.compute_dtype));
  const bool final_point_needed = !convergence_.abandoned() && batches_ > convergence_.last_batches();
  for (const v1::ConvergencePoint& point :
       convergence_.Points(final_point_needed ? CurrentConvergencePoint() : std::nullopt)) {
    *report.add_convergence() = point;
  }
  const QuantizerCounts quantizers = model_->Quantizers();
  if (quantizers.quantizers > 0) {
    report.mutable_quantizers()->set_count(quantizers.quantizers);
    report.mutable_quantizers()->set_observers_frozen(quantizers.observers_frozen);
  }
  if (options_.iterations > 1) {
    for (const v1::IterationStep& step : iteration_steps_) *report.add_iterations() = step;
    if (batches_ > 0) *report.add_iterations() = PassMovement();
  }
  for (const auto& layer : collector_->layers()) {
    auto old_mean = Uploaded(layer->mean_key);
    auto old_var = Uploaded(layer->var_key);
    if (!old_mean.ok() || !old_var.ok()) continue;
    v1::LayerReport* out = report.add_layers();
    DescribeLayer(*layer, *old_mean, *old_var, options_.estimator, batches_, out);
    if (!out->used()) report.add_unused_layers(layer->name);
    if (out->used() && !out->excluded()) {
      report.set_layers_recalibrated(report.layers_recalibrated() + 1);
    }
  }
  return report;
}

}  // namespace recal::engine
