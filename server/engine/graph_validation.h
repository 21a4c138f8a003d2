// What an uploaded model may do. A TorchScript archive is code: its graphs may read and
// write files (aten::from_file, aten::save), sleep, fork or call operators registered by
// other libraries. Before a model runs, every graph it holds is checked against an allowlist
// of operators (tensor math, shapes, control flow and the prim ops TorchScript needs) and
// its size is bounded. What the allowlist cannot stop (endless loops, huge allocations) is
// for the process that runs the model to bound.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace torch::jit {
struct Module;
}

namespace recal::engine {

struct GraphPolicy {
  bool trusted = false;                        // the user's own file: nothing is checked
  std::vector<std::string> extra_allowed_ops;  // "ns::name", added by an administrator
  // Nodes in all graphs together, and in forward once every call in it is inlined (what the
  // rewrite builds): beyond either the model is refused before anything is inlined.
  int64_t max_graph_nodes = 500000;
  // Blocks (if, loop) or brackets nested in a TorchScript archive's code: Python itself takes
  // 100 levels of indentation and 200 of brackets; what is deeper is crafted, and costs
  // quadratic time in every pass over it.
  int64_t max_graph_depth = 200;
};

// OK, or INVALID_ARGUMENT naming the first operator outside the allowlist with the function
// and the source location it comes from, or the size that is too large.
absl::Status ValidateGraphs(const torch::jit::Module& module, const GraphPolicy& policy);

// The built-in allowlist, sorted.
std::vector<std::string> AllowedOperators();

}  // namespace recal::engine
