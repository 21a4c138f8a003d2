// Collects BatchNorm statistics for one recalibration. The rewritten graph calls Observe()
// in place of every aten::batch_norm; each job has its own collector.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <c10/util/Optional.h>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "server/engine/layer_stats.h"

namespace recal::engine {

struct Layer {
  std::string name;      // module path ("layer1.0.bn1"), or the running-mean key for functional BN
  std::string mean_key;  // state_dict keys of the buffers
  std::string var_key;
  int64_t channels = 0;
  bool excluded = false;
  int64_t calls = 0;          // executions, excluded layers included
  int64_t refined_calls = 0;  // executions whose statistics were recomputed in float64
  LayerStats stats;
  // On the layer's device, so that checking costs no host sync per call (nor per batch: the
  // progress tick reads them, BatchFlags): whether some call in the current batch saw a NaN
  // or Inf.
  at::Tensor nonfinite;
  // Where the device kernel leaves a call's mean and 1/sqrt(var + eps) for the normalisation
  // (batch_moments.h): made at the first call, reused by every later one.
  at::Tensor batch_mean, batch_invstd;
};

// One batch's non-finite flags, left on the device until a progress tick reads them on the
// host (Recalibration): reading them at once would stall the host every batch on a GPU.
struct BatchFlags {
  int64_t batch = 0;
  std::vector<const Layer*> layers;  // the recalibrated layers it measured, in execution order
  at::Tensor flags;                  // float64 [layers.size()]: nonzero where a call saw a NaN or Inf
};

class Collector {
 public:
  // `buffer_names`: every buffer of the observed module by its data pointer; only running
  // statistics that are buffers can be written back. `included(name)` picks the layers.
  Collector(std::unordered_map<const void*, std::string> buffer_names,
            std::function<bool(const std::string&)> included);

  // Layers known before running (modules with running_mean and running_var buffers), so
  // that a layer forward never reaches is reported as unused.
  void DeclareLayer(const at::Tensor& running_mean, const at::Tensor& running_var);

  at::Tensor Observe(const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                     const c10::optional<at::Tensor>& bias, const at::Tensor& running_mean,
                     const at::Tensor& running_var, bool training, double momentum, double eps,
                     bool cudnn_enabled);

  // Brackets one forward pass. EndBatch keeps the batch's per-layer non-finite flags, on the
  // device and without a host sync, for TakeBatchFlags.
  void BeginBatch(int64_t index);
  void EndBatch();
  // The flags of the batches ended since the last call, oldest first.
  std::vector<BatchFlags> TakeBatchFlags();

  // Forgets every call recorded so far (the layers stay known), flags not taken included:
  // for a first batch that failed part-way and runs again, and for the next pass.
  void ResetStatistics();

  // Diagnosis of a batch whose flags showed a NaN or Inf, run again with this on: every observed call
  // checks its input at once (a host sync per call) and the first non-finite one found, in
  // execution order, is described with its layer, batch and position.
  void set_locate_nonfinite(bool on);
  std::string nonfinite_location() const;  // empty: nothing found

  // Layers in the order they were declared or first seen.
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

 private:
  Layer* FindOrAddLayer(const at::Tensor& running_mean, const at::Tensor& running_var);
  // Normalises a float32 or float64 `input` of a recalibrated layer by its batch statistics
  // and records them.
  at::Tensor Measure(Layer* layer, const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                     const c10::optional<at::Tensor>& bias, const at::Tensor& running_mean, double eps,
                     bool cudnn_enabled);
  // The same on a device with Recal's statistics kernel (batch_moments.h): one pass over
  // `input` in its own dtype, merged into the layer's accumulators there, and the output
  // normalised by the statistics it leaves; no host synchronisation.
  at::Tensor MeasureOnDevice(Layer* layer, const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                             const c10::optional<at::Tensor>& bias, double eps);
  void LocateNonFinite(const Layer& layer, const at::Tensor& input);

  std::unordered_map<const void*, std::string> buffer_names_;
  std::function<bool(const std::string&)> included_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unordered_map<const void*, Layer*> by_mean_buffer_;
  int64_t batch_index_ = 0;
  std::vector<Layer*> called_;  // layers in the order the current batch first called them
  std::vector<BatchFlags> batch_flags_;  // ended batches' flags, not taken yet
  bool locate_nonfinite_ = false;
  std::string nonfinite_location_;
};

}  // namespace recal::engine
