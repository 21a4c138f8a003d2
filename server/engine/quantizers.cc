// Registered when librecal_engine.so loads (observed_batch_norm.cc says why it is shared).
#include "server/engine/quantizers.h"

#include <limits>
#include <numeric>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <torch/library.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace recal::engine {
namespace {

// Quantizers whose observer never saw data hold no range: ATen's observer would take the
// first batch's, so frozen they would quantize with the placeholder scale 1, zero point 0.
void CheckObserved(const at::Tensor& running_min, const at::Tensor& running_max) {
  TORCH_CHECK(running_min.numel() > 0 && !at::isinf(running_min).any().item<bool>() &&
                  !at::isinf(running_max).any().item<bool>(),
              "this quantizer's observer has never seen data (its running min / max are empty or infinite: "
              "the model was exported right after prepare_qat_fx / prepare_qat_pt2e), so it holds no scale "
              "to apply: run some training or calibration batches through the model before exporting it");
}

// aten::fused_moving_avg_obs_fake_quant with its observer held still: the fake quantization
// ATen's operator applies (fused_obs_fake_quant.cpp), with the scale and zero point the model
// holds instead of ones recomputed from the running range, and nothing written.
at::Tensor FrozenFakeQuantize(const at::Tensor& self, const at::Tensor& /*observer_on*/,
                              const at::Tensor& fake_quant_on, const at::Tensor& running_min,
                              const at::Tensor& running_max, const at::Tensor& scale, const at::Tensor& zero_point,
                              double /*averaging_const*/, int64_t quant_min, int64_t quant_max, int64_t ch_axis,
                              bool per_row_fake_quant, bool /*symmetric_quant*/) {
  if (self.numel() == 0 || fake_quant_on.item().toInt() == 0) return self.clone();
  CheckObserved(running_min, running_max);
  if (per_row_fake_quant) {
    return std::get<0>(at::fake_quantize_per_channel_affine_cachemask(self, scale, zero_point, ch_axis, quant_min,
                                                                       quant_max));
  }
  return std::get<0>(at::_fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
      self, scale, zero_point, at::ones({1}, self.options().dtype(at::kLong)), quant_min, quant_max));
}

// ---------------------------------------------------------------- quantized_decomposed
// torch's Python implementations, operation for operation (the same ATen kernels in the same
// order, so the same float32 results): torch/ao/quantization/fx/_decomposed.py.

void CheckRange(int64_t quant_min, int64_t quant_max, at::ScalarType dtype) {
  const absl::Status range = CheckQuantRange(quant_min, quant_max, static_cast<int64_t>(dtype));
  TORCH_CHECK(range.ok(), std::string(range.message()));
}

// float16 and bfloat16 are widened (exactly); anything but float32 then is refused.
at::Tensor FloatInput(const at::Tensor& input) {
  at::Tensor x = input;
  if (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16) x = x.to(at::kFloat);
  TORCH_CHECK(x.scalar_type() == at::kFloat, "quantizing a ", x.scalar_type(), " tensor: float32 expected");
  return x;
}

at::Tensor QuantizePerTensor(const at::Tensor& input, double scale, int64_t zero_point, int64_t quant_min,
                             int64_t quant_max, at::ScalarType dtype) {
  const at::Tensor x = FloatInput(input);
  CheckRange(quant_min, quant_max, dtype);
  const double inv_scale = 1.0 / scale;
  return at::clamp(at::round(x * inv_scale) + zero_point, c10::Scalar(quant_min), c10::Scalar(quant_max)).to(dtype);
}

std::pair<double, int64_t> OneScale(const at::Tensor& scale, const at::Tensor& zero_point) {
  TORCH_CHECK(scale.numel() == 1, "a per-tensor scale of ", scale.numel(), " elements, not one");
  TORCH_CHECK(zero_point.numel() == 1, "a per-tensor zero point of ", zero_point.numel(), " elements, not one");
  return {scale.item().toDouble(), zero_point.item().toInt()};
}

at::Tensor QuantizePerTensorTensor(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& zero_point,
                                   int64_t quant_min, int64_t quant_max, at::ScalarType dtype) {
  const auto [s, z] = OneScale(scale, zero_point);
  return QuantizePerTensor(input, s, z, quant_min, quant_max, dtype);
}

at::Tensor DequantizePerTensor(const at::Tensor& input, double scale, int64_t zero_point, int64_t /*quant_min*/,
                               int64_t /*quant_max*/, at::ScalarType dtype, std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK(input.scalar_type() == dtype, "dequantizing a ", input.scalar_type(), " tensor declared ", dtype);
  const absl::Status known = CheckQuantizedDtype(static_cast<int64_t>(dtype));
  TORCH_CHECK(known.ok(), std::string(known.message()));
  // Python's (input.to(out_dtype) - zero_point) * scale.
  return (input.to(out_dtype.value_or(at::kFloat)) - zero_point) * scale;
}

at::Tensor DequantizePerTensorTensor(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& zero_point,
                                     int64_t quant_min, int64_t quant_max, at::ScalarType dtype,
                                     std::optional<at::ScalarType> out_dtype) {
  const auto [s, z] = OneScale(scale, zero_point);
  return DequantizePerTensor(input, s, z, quant_min, quant_max, dtype, out_dtype);
}

// The permutation that swaps `axis` and 0 (its own inverse), and the shape that lays
// per-channel parameters along dimension 0.
std::pair<std::vector<int64_t>, std::vector<int64_t>> AxisFirst(const at::Tensor& input, int64_t axis,
                                                                const at::Tensor& scales) {
  TORCH_CHECK(axis < input.dim() && axis >= -input.dim(), "axis ", axis, " of a ", input.dim(), "-d tensor");
  if (axis < 0) axis += input.dim();
  std::vector<int64_t> order(input.dim());
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[0], order[axis]);
  std::vector<int64_t> shape(input.dim(), 1);
  shape[0] = scales.size(0);
  return {order, shape};
}

at::Tensor QuantizePerChannel(const at::Tensor& input, const at::Tensor& scales, const at::Tensor& zero_points,
                              int64_t axis, int64_t quant_min, int64_t quant_max, at::ScalarType dtype) {
  const at::Tensor x = FloatInput(input);
  CheckRange(quant_min, quant_max, dtype);
  const auto [order, shape] = AxisFirst(x, axis, scales);
  // Python's 1.0 / scales is scales.reciprocal() * 1.0, which is exact.
  const at::Tensor inv_scales = at::reciprocal(scales.view(shape));
  const at::Tensor q = at::clamp(at::round(x.permute(order) * inv_scales) + zero_points.view(shape),
                                 c10::Scalar(quant_min), c10::Scalar(quant_max));
  return q.permute(order).to(dtype);
}

at::Tensor DequantizePerChannel(const at::Tensor& input, const at::Tensor& scales,
                                const std::optional<at::Tensor>& zero_points, int64_t axis, int64_t quant_min,
                                int64_t quant_max, at::ScalarType dtype, std::optional<at::ScalarType> out_dtype) {
  TORCH_CHECK(input.scalar_type() == dtype, "dequantizing a ", input.scalar_type(), " tensor declared ", dtype);
  CheckRange(quant_min, quant_max, dtype);
  const auto [order, shape] = AxisFirst(input, axis, scales);
  const at::Tensor x = input.permute(order);
  const at::Tensor s = scales.view(shape);
  const at::Tensor values = zero_points && zero_points->defined() ? (x - zero_points->view(shape)) * s : x * s;
  return values.to(out_dtype.value_or(at::kFloat)).permute(order);
}

}  // namespace

QuantizerKind QuantizerKindOf(absl::string_view op) {
  if (op == kFusedFakeQuantizeOp) return QuantizerKind::kObserving;
  if (absl::StartsWith(op, "aten::fake_quantize_per_") || absl::StartsWith(op, "aten::_fake_quantize_per_")) {
    return QuantizerKind::kFakeQuantize;
  }
  if (absl::StartsWith(op, "quantized_decomposed::quantize_per_")) return QuantizerKind::kQuantize;
  if (absl::StartsWith(op, "quantized_decomposed::dequantize_per_")) return QuantizerKind::kDequantize;
  return QuantizerKind::kNone;
}

namespace {

// The range of a quantized_decomposed integer type (its _DTYPE_TO_QVALUE_BOUNDS), or none.
std::optional<std::pair<int64_t, int64_t>> QuantizedBounds(int64_t dtype) {
  switch (static_cast<at::ScalarType>(dtype)) {
    case at::kByte: return std::make_pair(int64_t{0}, int64_t{255});
    case at::kChar: return std::make_pair(int64_t{-128}, int64_t{127});
    case at::ScalarType::UInt16: return std::make_pair(int64_t{0}, int64_t{65535});
    case at::kShort: return std::make_pair(int64_t{-32768}, int64_t{32767});
    case at::kInt: return std::make_pair(int64_t{INT32_MIN}, int64_t{INT32_MAX});
    default: return std::nullopt;
  }
}

}  // namespace

absl::Status CheckQuantizedDtype(int64_t dtype) {
  if (QuantizedBounds(dtype)) return absl::OkStatus();
  const std::string name = dtype >= 0 && dtype < static_cast<int64_t>(at::ScalarType::NumOptions)
                               ? c10::toString(static_cast<at::ScalarType>(dtype))
                               : absl::StrCat("number ", dtype);
  return absl::InvalidArgumentError(absl::StrCat("quantized dtype ", name,
                                                 " is not one Recal quantizes to (uint8, int8, uint16, int16 or int32)"));
}

absl::Status CheckQuantRange(int64_t quant_min, int64_t quant_max, int64_t dtype) {
  const auto bounds = QuantizedBounds(dtype);
  if (!bounds) return CheckQuantizedDtype(dtype);
  if (quant_min > quant_max || quant_min < bounds->first || quant_max > bounds->second) {
    return absl::InvalidArgumentError(absl::StrCat("quant_min ", quant_min, " / quant_max ", quant_max,
                                                   " are not a range within the quantized type's [", bounds->first,
                                                   ", ", bounds->second, "]"));
  }
  return absl::OkStatus();
}

TORCH_LIBRARY_FRAGMENT(recal, m) {
  // No argument written: a pure function of its inputs, which the JIT may drop when unused.
  m.def(torch::schema("recal::frozen_fake_quantize(Tensor self, Tensor observer_on, Tensor fake_quant_on, "
                      "Tensor running_min, Tensor running_max, Tensor scale, Tensor zero_point, "
                      "float averaging_const, int quant_min, int quant_max, int ch_axis, "
                      "bool per_row_fake_quant=False, bool symmetric_quant=False) -> Tensor",
                      c10::AliasAnalysisKind::FROM_SCHEMA),
        TORCH_FN(FrozenFakeQuantize));
}

// The schemas of torch/ao/quantization/fx/_decomposed.py, which only Python registers.
TORCH_LIBRARY(quantized_decomposed, m) {
  m.def("quantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, int quant_max, "
        "ScalarType dtype) -> Tensor",
        TORCH_FN(QuantizePerTensor));
  m.def("quantize_per_tensor.tensor(Tensor input, Tensor scale, Tensor zero_point, int quant_min, int quant_max, "
        "ScalarType dtype) -> Tensor",
        TORCH_FN(QuantizePerTensorTensor));
  m.def("dequantize_per_tensor(Tensor input, float scale, int zero_point, int quant_min, int quant_max, "
        "ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
        TORCH_FN(DequantizePerTensor));
  m.def("dequantize_per_tensor.tensor(Tensor input, Tensor scale, Tensor zero_point, int quant_min, "
        "int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
        TORCH_FN(DequantizePerTensorTensor));
  m.def("quantize_per_channel(Tensor input, Tensor scales, Tensor zero_points, int axis, int quant_min, "
        "int quant_max, ScalarType dtype) -> Tensor",
        TORCH_FN(QuantizePerChannel));
  m.def("dequantize_per_channel(Tensor input, Tensor scales, Tensor? zero_points, int axis, int quant_min, "
        "int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None) -> Tensor",
        TORCH_FN(DequantizePerChannel));
}

}  // namespace recal::engine
