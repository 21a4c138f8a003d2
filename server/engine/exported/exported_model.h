// A PT2 archive (torch.export.save) as an ObservedModel: its graph planned once
// (program_plan.h) and run step by step over the dispatcher (interpreter.h), its weights
// read from the archive's raw records, its result the same archive with new statistics.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/engine/observed_model.h"

namespace recal::engine::exported {

absl::StatusOr<std::unique_ptr<ObservedModel>> LoadExportedModel(std::shared_ptr<ReadAdapter> file,
                                                                  const LoadOptions& options);

}  // namespace recal::engine::exported
