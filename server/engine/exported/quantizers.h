// The quantizers of an exported program's plan (server/engine/quantizers.h says what Recal
// makes of quantizers): their fixed arguments checked when the program is planned, and the
// observing ones planned as recal::frozen_fake_quantize.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "server/engine/exported/program_plan.h"
#include "server/engine/quantizers.h"

namespace recal::engine::exported {

// For a step just planned (its operator resolved, its arguments typed): sets step.quantizer;
// checks a quantizer's ranges, dtype and flags, which the program must state as constants
// (quant_min <= quant_max, within the quantized type for quantize / dequantize operators);
// and plans aten::fused_moving_avg_obs_fake_quant as recal::frozen_fake_quantize, which takes
// the same arguments and writes none of them. INVALID_ARGUMENT saying which argument is wrong.
absl::Status PlanQuantizer(Step& step);

// Quantizer steps of `graph`, nested graphs included.
QuantizerCounts CountQuantizers(const Graph& graph);

// The slots a quantizer step reads besides the activation it quantizes (scales, zero points,
// an observer's range and flags); none for any other step.
std::vector<Slot> QuantizerParameterSlots(const Step& step);

}  // namespace recal::engine::exported
