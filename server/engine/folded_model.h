// A recalibrated model in the form quantized deployment takes: in eval mode, each BatchNorm
// that directly follows a convolution (or, in an exported program, a linear layer) folded into
// that layer's weight and bias, so that the layer alone computes what both computed in eval
// mode. The rest stays as it was, in eval mode; the folded model says which and why.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recal::v1 {
class BatchNormFold;
class RunReport;
}  // namespace recal::v1

namespace recal::engine {

struct KeptBatchNorm {
  std::string name;    // the layer's name, as the report gives it
  std::string reason;  // why it was not folded, in the user's terms
};

struct FoldedModel {
  std::string bytes;                // the folded program, a PT2 archive
  std::vector<std::string> folded;  // the layers folded, in graph order
  std::vector<KeptBatchNorm> kept;
};

// The folded form of the recalibrated model at `path` (what Recalibration::WriteModel wrote).
// FAILED_PRECONDITION, with every layer's reason, when no BatchNorm can be folded, when the
// model cannot run in eval mode as a file (an exported program that draws random numbers
// other than dropout), or when it is TorchScript; INVALID_ARGUMENT when `path` is no model.
absl::StatusOr<FoldedModel> FoldBatchNorms(const std::string& path);

// Folds the model at `model_path` into `folded_path` (written whole or not at all) and says
// what it folded in `report`.
absl::Status WriteFoldedModel(const std::string& model_path, const std::string& folded_path, v1::RunReport* report);

// What the report says of it.
v1::BatchNormFold FoldReport(const FoldedModel& folded);

}  // namespace recal::engine
