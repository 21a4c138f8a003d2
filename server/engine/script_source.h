// The size of a TorchScript archive's code, counted from its text before LibTorch compiles
// it. Compiling is what costs (tens of seconds for a few hundred thousand lines, more than
// linear; a 50 KB compressed archive holds them), and blocks nested a thousand deep make
// every later step quadratic (the code the engine saves grows to tens of MB and no longer
// loads): both are refused here, in milliseconds, before torch::jit::load.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "server/engine/graph_validation.h"
#include "server/engine/model_file.h"

namespace recal::engine {

// OK, or INVALID_ARGUMENT naming the limit: more lines of code in code/ than
// policy.max_graph_nodes (each line of TorchScript's code makes at least one node of a
// graph), more code than kMaxCodeBytesPerNode bytes per allowed node, or blocks or brackets
// nested deeper than policy.max_graph_depth. Nothing is checked for a trusted policy.
absl::Status CheckScriptSource(const std::shared_ptr<ReadAdapter>& file, const GraphPolicy& policy);

// Far more than any line the TorchScript printer writes; bounds what is decompressed.
inline constexpr int64_t kMaxCodeBytesPerNode = 256;

}  // namespace recal::engine
