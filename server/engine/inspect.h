// What a model offers for recalibration, found without running it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/input_contract.h"
#include "server/engine/graph_validation.h"

namespace recal::engine {

struct DeclaredLayer {
  std::string name;  // module path
  std::string mean_key;
  std::string var_key;
  int64_t channels = 0;
};

struct ModelInspection {
  // The BatchNorm modules; functional batch_norm on other buffers is only found when the
  // model runs.
  std::vector<DeclaredLayer> layers;
  ModelInputs inputs;  // what every batch must fit (common/input_contract.h)
};

// Loads the archive, validates its graphs and instruments a copy, as a recalibration would:
// fails for the same reasons (not an archive, an operator outside the allowlist, no
// BatchNorm, frozen).
absl::StatusOr<ModelInspection> InspectModel(const std::string& path, const GraphPolicy& policy);

}  // namespace recal::engine
