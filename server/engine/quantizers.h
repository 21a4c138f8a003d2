// Quantizers in the models Recal runs: the fake quantization of quantization-aware training
// (torch.ao's and torchao's FusedMovingAvgObsFakeQuantize, the fake_quantize_* operators) and
// the quantize / dequantize operators of a program torchao's convert_pt2e made
// (quantized_decomposed::*). Recal re-estimates BatchNorm with every quantizer fixed, as
// AIMET does: each applies the scale and zero point the model holds, and no observer moves
// while the calibration data runs (an observer that moved would quantize each batch on a
// range the data set, not the model's).
//
// aten::fused_moving_avg_obs_fake_quant is the one operator that observes: it moves its
// running min / max toward each batch's, and, observer on or off, recomputes its scale and
// zero point from them and writes them into the model's buffers before fake-quantizing
// (ATen's fused_obs_fake_quant.cpp). Recal runs it as recal::frozen_fake_quantize instead:
// the same arguments, no write; the fake quantization ATen's operator applies, with the
// stored scale and zero point. For a model whose last training step wrote its scales (the
// operator always does) that is exactly what torch.ao.quantization.disable_observer gives.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace recal::engine {

// The operator that stands for aten::fused_moving_avg_obs_fake_quant (its schema's
// arguments, in the same order, none written).
inline constexpr char kFrozenFakeQuantizeOp[] = "recal::frozen_fake_quantize";
inline constexpr char kFusedFakeQuantizeOp[] = "aten::fused_moving_avg_obs_fake_quant";

enum class QuantizerKind {
  kNone,
  kObserving,    // aten::fused_moving_avg_obs_fake_quant: observes, Recal holds it still
  kFakeQuantize,  // aten::fake_quantize_*: applies the scale and zero point it is given
  kQuantize,     // quantized_decomposed::quantize_per_*
  kDequantize,   // quantized_decomposed::dequantize_per_*
};

// What `op` ("aten::fake_quantize_per_tensor_affine", ...) is among the quantizers.
QuantizerKind QuantizerKindOf(absl::string_view op);

// The operators of quantized_decomposed that Recal registers (their semantics are torch's
// Python ones, torch/ao/quantization/fx/_decomposed.py): the quantize / dequantize pairs of
// converted pt2e programs, per tensor (scale and zero point as numbers or as one-element
// tensors) and per channel. Other operators of that namespace (choose_qparams, per token,
// ...) are not registered: a program holding them is refused as holding an unknown operator.
inline constexpr const char* kQuantizedDecomposedOps[] = {
    "quantized_decomposed::quantize_per_tensor", "quantized_decomposed::dequantize_per_tensor",
    "quantized_decomposed::quantize_per_channel", "quantized_decomposed::dequantize_per_channel"};

// Quantizers of a model, for the report.
struct QuantizerCounts {
  int quantizers = 0;        // fake quantization and quantize nodes
  int observers_frozen = 0;  // of them, fused observers run as recal::frozen_fake_quantize
};

// OK when `dtype` (a ScalarType's number) is an integer type of quantized_decomposed
// (uint8, int8, uint16, int16, int32), and quant_min..quant_max a range within it;
// INVALID_ARGUMENT saying which is wrong.
absl::Status CheckQuantizedDtype(int64_t dtype);
absl::Status CheckQuantRange(int64_t quant_min, int64_t quant_max, int64_t dtype);

}  // namespace recal::engine
