// Instruments a loaded TorchScript module so that every BatchNorm reports to a Collector.
#pragma once

#include <cstdint>

#include <torch/script.h>

#include "absl/status/statusor.h"
#include "recal/v1/report.pb.h"
#include "server/engine/quantizers.h"

namespace recal::engine {

struct RewriteCounts {
  int batch_norms = 0;  // aten::batch_norm nodes now calling recal::observed_batch_norm
  int dropouts = 0;     // dropout-like nodes whose `train` argument was fixed by the mode
  int nodes_cut = 0;    // nodes (nested ones included) the forward no longer runs
  // Quantizer nodes; the observing ones (aten::fused_moving_avg_obs_fake_quant) now call
  // recal::frozen_fake_quantize (server/engine/quantizers.h).
  QuantizerCounts quantizers;
};

// Inlines `forward` and replaces each aten::batch_norm with recal::observed_batch_norm bound
// to `collector`, and each aten::fused_moving_avg_obs_fake_quant with
// recal::frozen_fake_quantize; with mode EVAL or TRAIN fixes the `train` argument of dropout-like nodes
// (traced models bake the mode in as a constant). Must run before the first forward: an
// executor built earlier would never see the rewrite. Fails if there is no BatchNorm, or if
// its statistics are constants (a frozen model).
// With `end_at_last_batch_norm`, forward then returns None right after the last top-level
// node that holds an observed BatchNorm, and what fed only the rest (a classifier head, a
// loss, a decoder without BatchNorm) is removed: no statistic depends on it. Nodes with
// side effects (attribute writes, in-place writes to module state, prints, raises) stay.
// The rewritten module is for observing only; it is never saved.
absl::StatusOr<RewriteCounts> InstrumentForward(torch::jit::Module& module, int64_t collector,
                                                v1::ModuleMode mode, bool end_at_last_batch_norm);

// Names of Recal operators anywhere in the module's methods and their callees; a model to be
// saved must have none.
std::vector<std::string> RecalOpsIn(const torch::jit::Module& module);

}  // namespace recal::engine
