// Runs the steps of a Plan over the c10 dispatcher: each operator called boxed, as
// TorchScript's interpreter calls it, with BatchNorm handed to the Collector instead.
#pragma once

#include <vector>

#include <ATen/core/ivalue.h>

#include "server/engine/exported/program_plan.h"

namespace recal::engine {
class Collector;
}

namespace recal::engine::exported {

// Runs `step` over `values` (indexed by slot) and stores what it returns in its output
// slots. A BatchNorm step calls `collector` when its statistics are tensors. Throws what
// LibTorch throws, prefixed with the node.
void RunStep(const Step& step, std::vector<c10::IValue>& values, Collector* collector);

}  // namespace recal::engine::exported
