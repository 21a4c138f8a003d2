// The input contract a torch.export program carries, read into recal.v1.ModelInput
// (common/input_contract.h): each tensor user input's name and dtype, and its sizes as the
// program was exported, a static size, or coefficient * Dim + offset with the Dim's range from
// the program's range_constraints. A size whose expression is not linear in one Dim
// (FloorDiv, two Dims) is kept as unchecked text: torch's own check leaves it to the
// program's asserts, and so does Recal.
#pragma once

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/input_contract.h"

namespace recal::engine::exported {

// INVALID_ARGUMENT when the program's signature or a user input's metadata is malformed.
absl::StatusOr<ModelInputs> ReadInputContract(const nlohmann::json& program);

}  // namespace recal::engine::exported
