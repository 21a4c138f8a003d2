#include "server/engine/collector.h"

#include <cmath>
#include <cstdlib>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engine/batch_moments.h"

namespace recal::engine {
namespace {

// Above this |mean| / std a channel's float32 batch statistics are recomputed in float64.
// LibTorch's CPU kernels for channels-last and (N, C) inputs sum in float32 and lose
// ~ (|mean| / std)^2 * 1e-9 of the variance (9% at 1e4); at 8 that is below 1e-7.
constexpr double kRefineRatio = 8.0;

// Whether a layer's input is measured by Recal's statistics kernel on its device: on a GPU
// where the kernel is built (batch_moments.h), unless RECAL_GPU_STATISTICS=aten asks for
// ATen's kernels (the GPU check compares the two).
bool UsesDeviceKernel(const at::Tensor& input) {
  static const bool aten = [] {
    const char* choice = std::getenv("RECAL_GPU_STATISTICS");
    return choice != nullptr && std::string(choice) == "aten";
  }();
  const at::ScalarType t = input.scalar_type();
  return input.is_cuda() && !aten && input.dim() >= 2 &&
         (t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf) &&
         HasBatchMomentsKernel(c10::kCUDA);
}

std::string LayerNameOf(const std::string& mean_key) {
  constexpr absl::string_view kSuffix = ".running_mean";
  if (absl::EndsWith(mean_key, kSuffix)) return mean_key.substr(0, mean_key.size() - kSuffix.size());
  return mean_key;
}

std::vector<int64_t> NonChannelDims(const at::Tensor& input) {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// Whether `input` is float32 and LibTorch's CPU batch norm would take its channels-last
// kernel for it ((N, C, 1, 1) is contiguous too, and takes the contiguous one). Its float64
// kernels accumulate in float64.
bool ChannelsLastOnCpu(const at::Tensor& input) {
  if (!input.device().is_cpu() || input.scalar_type() != at::kFloat || input.is_contiguous()) return false;
  return (input.dim() == 4 && input.is_contiguous(at::MemoryFormat::ChannelsLast)) ||
         (input.dim() == 5 && input.is_contiguous(at::MemoryFormat::ChannelsLast3d));
}

// Training-mode batch norm of a channels-last float32 input, and its float64 mean and
// biased variance. LibTorch's fused channels-last CPU kernel sums in float32: at 1e5 values
// per channel (32x64x56x56) it was measured to lose 1.3e-5 of the mean and 2.4e-5 of the
// variance of every channel, which every later layer inherits through its input. The
// statistics are therefore taken in float64 in one pass (BatchMoments) and the
// eval-mode kernel normalises by them.
std::tuple<at::Tensor, at::Tensor, at::Tensor> NormaliseChannelsLast(
    const at::Tensor& input, const c10::optional<at::Tensor>& weight,
    const c10::optional<at::Tensor>& bias, const at::Tensor& running_mean, double eps,
    bool cudnn_enabled) {
  auto [mean, var] = BatchMoments(input);
  at::Tensor out = at::batch_norm(input, weight, bias, mean.to(running_mean.scalar_type()),
                                  var.to(running_mean.scalar_type()), /*training=*/false,
                                  /*momentum=*/0.0, eps, cudnn_enabled);
  return {out, mean, var};
}

// Recomputes, in float64, the statistics and the normalised output of the channels `idx`.
void RefineChannels(const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                    const c10::optional<at::Tensor>& bias, double eps, const at::Tensor& idx,
                    at::Tensor& mean, at::Tensor& var, at::Tensor& out) {
  at::Tensor x = input.index_select(1, idx).to(at::kDouble);
  const std::vector<int64_t> dims = NonChannelDims(input);
  at::Tensor m = x.mean(dims);
  at::Tensor v = x.var(dims, /*unbiased=*/false);
  mean.index_copy_(0, idx, m);
  var.index_copy_(0, idx, v);

  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = idx.size(0);
  at::Tensor y = (x - m.view(shape)) / (v + eps).sqrt().view(shape);
  if (weight && weight->defined()) y = y * weight->index_select(0, idx).to(at::kDouble).view(shape);
  if (bias && bias->defined()) y = y + bias->index_select(0, idx).to(at::kDouble).view(shape);
  out.index_copy_(1, idx, y.to(out.scalar_type()));
}

}  // namespace

Collector::Collector(std::unordered_map<const void*, std::string> buffer_names,
                     std::function<bool(const std::string&)> included)
    : buffer_names_(std::move(buffer_names)), included_(std::move(included)) {}

void Collector::DeclareLayer(const at::Tensor& running_mean, const at::Tensor& running_var) {
  std::lock_guard<std::mutex> lock(mu_);
  FindOrAddLayer(running_mean, running_var);
}

Layer* Collector::FindOrAddLayer(const at::Tensor& running_mean, const at::Tensor& running_var) {
  auto found = by_mean_buffer_.find(running_mean.data_ptr());
  if (found != by_mean_buffer_.end()) return found->second;
  auto mean_name = buffer_names_.find(running_mean.data_ptr());
  auto var_name = buffer_names_.find(running_var.data_ptr());
  // Statistics that are not buffers of the model (made on the fly) cannot be written back.
  if (mean_name == buffer_names_.end() || var_name == buffer_names_.end()) return nullptr;
  auto layer = std::make_unique<Layer>();
  layer->name = LayerNameOf(mean_name->second);
  layer->mean_key = mean_name->second;
  layer->var_key = var_name->second;
  layer->channels = running_mean.numel();
  layer->excluded = !included_(layer->name);
  Layer* raw = layer.get();
  layers_.push_back(std::move(layer));
  by_mean_buffer_[running_mean.data_ptr()] = raw;
  return raw;
}

at::Tensor Collector::Observe(const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                              const c10::optional<at::Tensor>& bias,
                              const at::Tensor& running_mean, const at::Tensor& running_var,
                              bool training, double momentum, double eps, bool cudnn_enabled) {
  Layer* layer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    layer = FindOrAddLayer(running_mean, running_var);
    if (layer != nullptr) ++layer->calls;
    if (layer != nullptr && !layer->excluded && !layer->nonfinite.defined()) {
      called_.push_back(layer);  // first call in this batch
    }
  }
  if (layer == nullptr) {
    return at::batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
                          cudnn_enabled);
  }
  if (layer->excluded) {  // normalised with its stored statistics, which stay as they are
    return at::batch_norm(input, weight, bias, running_mean, running_var, /*training=*/false,
                          momentum, eps, cudnn_enabled);
  }
  if (locate_nonfinite_) LocateNonFinite(*layer, input);
  if (UsesDeviceKernel(input)) return MeasureOnDevice(layer, input, weight, bias, eps);
  if (input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf) {
    // A reduced-precision forward (autocast): widening to float32 is exact, so the float32
    // path below measures exactly the activations this layer sees; its output goes on in
    // the precision it came in.
    return Measure(layer, input.to(at::kFloat), weight, bias, running_mean, eps, cudnn_enabled)
        .to(input.scalar_type());
  }
  return Measure(layer, input, weight, bias, running_mean, eps, cudnn_enabled);
}

at::Tensor Collector::Measure(Layer* layer, const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                              const c10::optional<at::Tensor>& bias, const at::Tensor& running_mean,
                              double eps, bool cudnn_enabled) {
  const int64_t channels = input.size(1);
  const int64_t n = channels > 0 ? input.numel() / channels : 0;  // values per channel
  at::Tensor out, mean, var;
  if (n > 1 && ChannelsLastOnCpu(input)) {
    std::tie(out, mean, var) = NormaliseChannelsLast(input, weight, bias, running_mean, eps, cudnn_enabled);
  } else {
    // With momentum 1 the fused kernel leaves this batch's mean and unbiased variance in the
    // scratch buffers: the statistics come with no extra pass over the activations.
    at::Tensor batch_mean = at::zeros_like(running_mean);
    at::Tensor batch_var = at::zeros_like(running_mean);
    out = at::batch_norm(input, weight, bias, batch_mean, batch_var, /*training=*/true,
                         /*momentum=*/1.0, eps, cudnn_enabled);
    // With n = 1 the kernel normalises correctly (every value is the mean: the output is the
    // bias) but its unbiased variance is 0/0; with n = 0 it leaves the scratch buffers
    // alone. Neither is a property of the data.
    if (n == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      layer->stats.AddCall(0, at::Tensor(), at::Tensor());
      return out;
    }
    mean = batch_mean.to(at::kDouble);
    var = n == 1 ? at::zeros_like(mean) : batch_var.to(at::kDouble).mul_(static_cast<double>(n - 1) / n);
  }

  // Only the CPU kernels were measured to lose precision; elsewhere the check would cost a
  // host sync per call. Statistics that overflow float32 while the input is finite are
  // recomputed too. With n = 1 the statistics are exact already.
  bool refine = false;
  if (input.device().is_cpu() && n > 1) {
    at::Tensor ill = (mean.abs() > var.sqrt() * kRefineRatio).logical_or_(
        at::isfinite(mean + var).logical_not_());
    refine = ill.any().item<bool>();
    if (refine) RefineChannels(input, weight, bias, eps, ill.nonzero().squeeze(1), mean, var, out);
  }
  at::Tensor nonfinite = at::isfinite(mean + var).all().logical_not();

  std::lock_guard<std::mutex> lock(mu_);
  layer->nonfinite = layer->nonfinite.defined() ? layer->nonfinite.logical_or(nonfinite) : nonfinite;
  if (refine) ++layer->refined_calls;
  layer->stats.AddCall(n, mean, var);
  return out;
}

at::Tensor Collector::MeasureOnDevice(Layer* layer, const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                                      const c10::optional<at::Tensor>& bias, double eps) {
  const int64_t channels = input.size(1);
  const int64_t n = channels > 0 ? input.numel() / channels : 0;  // values per channel
  std::lock_guard<std::mutex> lock(mu_);
  if (n == 0) {  // an empty selection: normalised (to nothing), counted, nothing measured
    layer->stats.AddCall(0, at::Tensor(), at::Tensor());
    return at::empty_like(input);
  }
  c10::InferenceMode ordinary_tensors(/*enabled=*/false);  // kept across batches
  const at::ScalarType stats = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (!layer->batch_mean.defined() || layer->batch_mean.scalar_type() != stats) {
    layer->batch_mean = at::empty({channels}, input.options().dtype(stats));
    layer->batch_invstd = at::empty({channels}, input.options().dtype(stats));
  }
  if (!layer->nonfinite.defined()) layer->nonfinite = at::zeros({}, input.options().dtype(at::kBool));
  const at::Tensor& accumulators = layer->stats.DeviceAccumulators(input.device(), channels);
  const BatchMomentsCounts counts{layer->stats.population().count(), layer->stats.call_means().count()};
  MergeBatchMoments(input, accumulators, counts, eps, layer->batch_mean, layer->batch_invstd, layer->nonfinite);
  layer->stats.CountDeviceCall(n);
  return at::batch_norm_elemt(input, weight, bias, layer->batch_mean, layer->batch_invstd, eps);
}

void Collector::LocateNonFinite(const Layer& layer, const at::Tensor& input) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!nonfinite_location_.empty()) return;  // the first in execution order is the cause
  }
  at::Tensor bad = at::isfinite(input).logical_not_();
  std::string found;
  if (bad.any().item<bool>()) {
    const int64_t flat = bad.reshape({-1}).nonzero()[0][0].item<int64_t>();
    std::vector<int64_t> index(input.dim());
    int64_t rest = flat;
    for (int64_t d = input.dim() - 1; d >= 0; --d) {
      index[d] = rest % input.size(d);
      rest /= input.size(d);
    }
    const double value = input.reshape({-1})[flat].item<double>();
    found = absl::StrCat("the input of BatchNorm layer '", layer.name, "' holds ",
                         std::isnan(value) ? "NaN" : value > 0 ? "+Inf" : "-Inf", " at [",
                         absl::StrJoin(index, ", "), "] in batch ", batch_index_,
                         " (made by the data or by the layers before it)");
  } else {
    const std::vector<int64_t> dims = NonChannelDims(input);
    at::Tensor x = input.to(at::kDouble);
    at::Tensor stats = x.mean(dims) + x.var(dims, /*unbiased=*/false);
    if (at::isfinite(stats.to(input.scalar_type())).all().item<bool>()) return;
    found = absl::StrCat("the batch statistics of BatchNorm layer '", layer.name, "' in batch ",
                         batch_index_, " overflow ", std::string(input.dtype().name()),
                         " (largest |activation| ", input.abs().max().item<double>(),
                         "), though every activation is finite");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (nonfinite_location_.empty()) nonfinite_location_ = std::move(found);
}

void Collector::set_locate_nonfinite(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  locate_nonfinite_ = on;
  nonfinite_location_.clear();
}

std::string Collector::nonfinite_location() const {
  std::lock_guard<std::mutex> lock(mu_);
  return nonfinite_location_;
}

void Collector::ResetStatistics() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& layer : layers_) {
    layer->calls = 0;
    layer->refined_calls = 0;
    layer->stats = LayerStats();
    layer->nonfinite = at::Tensor();
  }
  called_.clear();
  batch_flags_.clear();
}

void Collector::BeginBatch(int64_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  batch_index_ = index;
  for (Layer* layer : called_) layer->nonfinite = at::Tensor();
  called_.clear();
}

void Collector::EndBatch() {
  std::lock_guard<std::mutex> lock(mu_);
  BatchFlags batch{batch_index_, {}, {}};
  std::vector<at::Tensor> flags;
  for (Layer* layer : called_) {
    if (!layer->nonfinite.defined()) continue;  // every call saw no value: nothing measured
    batch.layers.push_back(layer);
    flags.push_back(layer->nonfinite);
  }
  // One tensor per batch, so that a tick copies few pieces; float64, so that it joins the
  // relative errors in the tick's one copy.
  if (!flags.empty()) batch.flags = at::stack(flags).to(at::kDouble);
  batch_flags_.push_back(std::move(batch));
}

std::vector<BatchFlags> Collector::TakeBatchFlags() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(batch_flags_, {});
}

}  // namespace recal::engine
