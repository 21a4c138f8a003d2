// A loaded model whose BatchNorm calls report to a Collector: what a Recalibration needs of
// a TorchScript module (script_model.h) or an exported program (exported/exported_model.h),
// whichever the archive holds.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/input_contract.h"
#include "recal/v1/report.pb.h"
#include "server/engine/graph_validation.h"
#include "server/engine/model_file.h"
#include "server/engine/quantizers.h"

namespace recal::engine {

class Collector;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class ObservedModel {
 public:
  virtual ~ObservedModel() = default;

  virtual ModelFormat format() const = 0;

  // What every batch must fit (common/input_contract.h): an exported program's user inputs
  // as it was exported, a TorchScript forward's tensor arguments (shapes undeclared).
  virtual const ModelInputs& inputs() const = 0;

  // Every buffer by its state_dict key, the very tensors the forward reads (the collector
  // knows BatchNorm layers by their buffers' data pointers).
  virtual const NamedTensors& buffers() const = 0;

  // (running_mean, running_var) of the BatchNorm layers known before running: every
  // BatchNorm module or node whose statistics are buffers.
  virtual std::vector<std::pair<at::Tensor, at::Tensor>> BatchNormBuffers() const = 0;

  // Makes every BatchNorm call `collector` and fixes dropout-like operators by `modules`;
  // with `end_at_last_batch_norm` the forward stops after the last BatchNorm and skips what
  // feeds no BatchNorm. Before the first Forward. Returns the number of nodes no longer run;
  // INVALID_ARGUMENT when there is no BatchNorm to observe.
  virtual absl::StatusOr<int> Observe(Collector* collector, v1::ModuleMode modules, bool end_at_last_batch_norm) = 0;

  // The model's quantizers (server/engine/quantizers.h) as its forward runs them: after
  // Observe, its observing ones held still.
  virtual QuantizerCounts Quantizers() const = 0;
  // The buffers its quantizers read besides the activation (scales, zero points, observers'
  // ranges and switches), by state_dict key: no forward may change them.
  virtual NamedTensors QuantizerState() const = 0;

  // The 4-d parameters (convolution weights), and laying them out in `format` in place.
  virtual std::vector<at::Tensor> ConvolutionWeights() const = 0;
  virtual void LayOutWeights(at::MemoryFormat format) = 0;

  // One forward over one batch's inputs (on the model's device). Throws what LibTorch throws.
  virtual void Forward(const std::vector<at::Tensor>& inputs) = 0;

  // The original archive with `buffers` (state_dict keys) replaced, and the check that such
  // bytes load again holding them (run beside writing them).
  virtual absl::StatusOr<std::string> Serialize(const NamedTensors& buffers) const = 0;
  virtual absl::Status CheckReloads(absl::string_view bytes, const NamedTensors& buffers) const = 0;
};

struct LoadOptions {
  c10::Device device{c10::kCPU};
  GraphPolicy graph_policy;
  // Load the copy Serialize writes from beside the run (TorchScript: a second load).
  bool preload_output_copy = true;
};

// The model at `path` (or "fd:N"), its format told from its bytes, its graphs validated.
absl::StatusOr<std::unique_ptr<ObservedModel>> LoadObservedModel(const std::string& path, const LoadOptions& options);

}  // namespace recal::engine
