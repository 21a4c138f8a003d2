// Folding an exported program's BatchNorms into the convolutions and linear layers before
// them (server/engine/folded_model.h), by editing the program's JSON and its weights: no
// Python, nothing of the upload run. What cannot be folded exactly is kept, with the reason.
#pragma once

#include "absl/status/statusor.h"
#include "server/engine/exported/pt2_archive.h"
#include "server/engine/folded_model.h"

namespace recal::engine::exported {

// `archive` (a recalibrated program) in eval mode with its foldable BatchNorms folded: each
// convolution's or linear layer's weight scaled per output channel by weight/sqrt(var + eps)
// (computed in float64, stored in the weight's dtype), its bias (added where it had none,
// named as torch names a layer's bias) set to the folded shift, the BatchNorm's node and the
// parameters and buffers only it read removed. Other BatchNorms and dropout run in eval mode.
absl::StatusOr<FoldedModel> FoldProgramBatchNorms(const Pt2Archive& archive);

}  // namespace recal::engine::exported
