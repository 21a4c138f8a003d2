// What eval mode computes where a program exported in train mode draws a random mask.
// Stochastic depth and masks like it are a subgraph, not an operator: a Bernoulli draw of
// keep probability p (into a fresh tensor), optionally divided by p, multiplied into an
// activation x. Eval mode returns x in every variant (timm's drop_path with or without
// scale_by_keep, torchvision's StochasticDepth at any p, 1 included), so the pattern is
// proved from the graph and replaced whole by x; a draw used any other way is left as it is,
// for the caller to refuse.
#pragma once

#include "server/engine/exported/program_plan.h"

namespace recal::engine::exported {

// Marks every proved mask in `graph` and the graphs nested in it: the multiply returns x
// itself (Step::returns_argument), the draw, its division and the fresh tensor it fills are
// eliminated. x itself, not a copy: in eval mode drop_path and StochasticDepth return their
// input object, so an in-place update of the product (`result += identity`, as in
// torchvision's EfficientNet) updates x there too, and does here. Returns how many masks it
// replaced.
int ReplaceRandomMasks(Graph& graph);

}  // namespace recal::engine::exported
