// A TorchScript archive (torch.jit.save) as an ObservedModel: validated against the
// operator allowlist, its forward inlined and rewritten so that every aten::batch_norm calls
// the collector (graph_rewrite.h); the result saved from a second, never rewritten copy.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/engine/observed_model.h"

namespace recal::engine {

absl::StatusOr<std::unique_ptr<ObservedModel>> LoadScriptModel(std::shared_ptr<ReadAdapter> file,
                                                                const std::string& path, const LoadOptions& options);

}  // namespace recal::engine
