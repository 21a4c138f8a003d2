// One recalibration: load a model (TorchScript or an exported program), feed it batches with every BatchNorm
// normalising by batch statistics, and produce the model with exact population statistics,
// the BatchNorm buffers alone, and a report. LibTorch only: no RPC, storage or job notions.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "recal/v1/report.pb.h"
#include "server/engine/convergence.h"
#include "server/engine/inspect.h"
#include "server/engine/model_file.h"
#include "server/engine/observed_model.h"
#include "server/engine/options.h"
#include "server/engine/shard_statistics.h"

namespace recal::engine {

class Collector;
struct BatchFlags;

// The next batch (its positional inputs), std::nullopt when the data has ended.
using NextBatchFn = std::function<absl::StatusOr<std::optional<std::vector<at::Tensor>>>()>;
// The batches of one pass over the data, from its start (each call a new pass).
using OpenPassFn = std::function<absl::StatusOr<NextBatchFn>()>;

struct Progress {
  int64_t batches = 0;
  int64_t samples = 0;
  int64_t max_batches = 0;  // the most batches this run will use
  double seconds = 0;
  double rel_std_error = 0;  // worst layer so far (infinite before two batches)
};

class Recalibration {
 public:
  // Loads the archive at `model_path` (or "fd:N"), validates its graphs
  // (Options::graph_policy) and instruments a private copy of it.
  static absl::StatusOr<std::unique_ptr<Recalibration>> Create(const std::string& model_path,
                                                               const Options& options);
  ~Recalibration();

  // One forward pass over one batch, accumulating every BatchNorm's statistics. What the
  // batch leaves on the device (its non-finite flags, its convergence point) is read at a
  // progress tick (Options::progress_tick_batches): Feed ticks at the first batch, every
  // tick-th and at max_batches; a caller that stops feeding elsewhere calls Tick() (RunShard
  // does). On the CPU every batch ticks, so every Feed returns its own batch's verdict.
  absl::Status Feed(const std::vector<at::Tensor>& inputs);
  // Reads, in one copy to the host, what the batches fed since the last tick left on the
  // device: fails naming the first batch and layer whose statistics are not finite, and adds
  // their convergence points. Nothing to do when the last batch fed ticked.
  absl::Status Tick();

  // Feeds batches until the data ends, max_batches is reached or the statistics are precise
  // enough (Options). `cancelled` is checked between batches. Then Finish(). `on_progress`
  // is called, and target_rel_error judged, at progress ticks only: after every batch on
  // the CPU, every Options::progress_tick_batches on a GPU, and after the last batch.
  absl::Status Run(const NextBatchFn& next_batch,
                   const std::function<void(const Progress&)>& on_progress = nullptr,
                   const std::atomic<bool>* cancelled = nullptr);

  // Options::iterations passes (Run each), `open_pass` giving each its batches; before each
  // pass after the first, NextPass. Progress counts the batches of every pass.
  absl::Status RunPasses(const OpenPassFn& open_pass,
                         const std::function<void(const Progress&)>& on_progress = nullptr,
                         const std::atomic<bool>* cancelled = nullptr);
  // Writes the statistics measured so far into the model's running buffers (what its forward
  // reads from now on), notes how far they moved (the report's iterations), and starts the
  // next pass: statistics, batches, samples and convergence from zero.
  absl::Status NextPass();

  // Sharded runs. Each shard feeds its batches (RunShard: Run without Finish, since one
  // shard may see no batch or not reach every layer) and hands over Statistics(); one
  // Recalibration of the same model and options merges them all, exactly, and Finish()es.
  absl::Status RunShard(const NextBatchFn& next_batch,
                        const std::function<void(const Progress&)>& on_progress = nullptr,
                        const std::atomic<bool>* cancelled = nullptr);
  ShardStatistics Statistics() const;
  // INVALID_ARGUMENT when a layer of the shard is not a BatchNorm of this model.
  absl::Status Merge(const ShardStatistics& shard);
  // The checks of a whole run: some batch was fed, some layer ran and was recalibrated, the
  // new statistics fit their buffers.
  absl::Status Finish() const;

  // Worst relative standard error over the layers recalibrated so far.
  double RelStdError() const;
  // Each recalibrated layer's, in one host sync (infinite for a layer without an estimate).
  std::vector<double> LayerRelStdErrors() const;

  // Writes the original archive with the new statistics, atomically, after proving that the
  // result loads and references no Recal operator.
  absl::Status WriteModel(const std::string& path) const;
  // The new running_mean / running_var of every BatchNorm layer, keyed as in state_dict().
  absl::Status WriteBatchNormBuffers(const std::string& path) const;
  // The report (the caller adds what it knows of the data: data, batch_size).
  v1::RunReport Report() const;

  // The BatchNorm layers known so far: every BatchNorm module, and functional calls seen.
  std::vector<DeclaredLayer> Layers() const;

  // What every batch must fit (common/input_contract.h); Feed refuses a batch that does not.
  const ModelInputs& inputs() const { return model_->inputs(); }

  // The layout of the forward's 4-d activations: Options::memory_format, or what kAuto chose
  // at the first batch (kAuto before it).
  MemoryFormat memory_format() const { return memory_format_; }

  int64_t batches() const { return batches_; }
  int64_t samples() const { return samples_; }
  // Graph nodes the forward no longer runs (Options::end_at_last_batch_norm).
  int forward_nodes_cut() const { return forward_nodes_cut_; }

 private:
  Recalibration(std::string model_path, Options options);
  // Every layer's buffers after recalibration: new statistics where it was recalibrated,
  // the stored ones where it was unused or excluded.
  NamedTensors FinalBuffers() const;
  // The model's buffer at a state_dict key.
  absl::StatusOr<at::Tensor> Buffer(const std::string& key) const;
  // Fails naming the first layer whose new statistics overflow its buffers' type.
  absl::Status CheckStatisticsFitBuffers() const;
  // INVALID_ARGUMENT naming the batch when `inputs` do not fit the model's contract.
  absl::Status CheckInputs(const std::vector<at::Tensor>& inputs) const;
  // One forward pass of the observed model over batch number `batch`.
  absl::Status Forward(const std::vector<at::Tensor>& args, int64_t batch);
  // The forward of the first batch, for auto memory format falling back to contiguous.
  absl::Status FirstForward(const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& args);
  // A batch on the device, its 4-d floating-point inputs in memory_format_.
  absl::StatusOr<std::vector<at::Tensor>> Arguments(const std::vector<at::Tensor>& inputs) const;
  // Feed; at a progress tick, the worst layer's relative standard error when `want_error`
  // (0 otherwise); std::nullopt where the batch did not tick.
  absl::StatusOr<std::optional<double>> FeedBatch(const std::vector<at::Tensor>& inputs, bool want_error);
  // Whether the batch just fed ticks: the first, every tick_batches_-th, the last of a pass.
  bool TickDue() const;
  // The tick after a last batch that did not tick (the data ended); std::nullopt with
  // nothing pending. Its time counts in seconds_.
  absl::StatusOr<std::optional<double>> TickIfPending(bool want_error);
  // The tick itself: one copy to the host of every pending flag and error (FeedBatch).
  absl::StatusOr<double> ReadTick(bool want_error);
  // The error for the first non-finite `layer` of `batch`; where `batch` is the last one fed,
  // after running it again to say where the first NaN or Inf is.
  absl::Status NonFiniteError(const BatchFlags& batch, size_t layer);
  // Each recalibrated layer's relative standard error, on the device (undefined while none
  // has samples): float64 [layers with samples].
  at::Tensor LayerRelStdErrorTensor() const;
  void SetMemoryFormat(MemoryFormat format);
  // The error summary after the batches so far (std::nullopt while no layer has one).
  std::optional<v1::ConvergencePoint> CurrentConvergencePoint() const;
  // How far this pass's statistics are from the running buffers' (what the pass read).
  v1::IterationStep PassMovement() const;
  // OK when no quantizer's scale, zero point or observer state changed since the model was
  // loaded; INVALID_ARGUMENT naming the buffer otherwise.
  absl::Status CheckQuantizersHeld() const;
  // The layer's running_mean / running_var as uploaded.
  absl::StatusOr<at::Tensor> Uploaded(const std::string& key) const;

  std::string model_path_;
  Options options_;
  c10::Device device_{c10::kCPU};
  MemoryFormat memory_format_ = MemoryFormat::kAuto;
  std::unique_ptr<Collector> collector_;
  std::unique_ptr<ObservedModel> model_;
  std::map<std::string, at::Tensor> buffers_;  // model_->buffers() by key
  // BatchNorm buffers as uploaded (NextPass overwrites the model's), by key.
  std::map<std::string, at::Tensor> uploaded_;
  // Copies of what model_->QuantizerState() held at load.
  NamedTensors quantizer_state_;
  int pass_ = 1;
  std::vector<v1::IterationStep> iteration_steps_;  // passes before this one
  int64_t batches_ = 0;
  int64_t samples_ = 0;
  double seconds_ = 0;
  bool stopped_early_ = false;
  int forward_nodes_cut_ = 0;
  ConvergenceHistory convergence_;
  // Batches between progress ticks (ProgressTickBatches).
  int64_t tick_batches_ = 1;
  // Whether a batch was fed since the last tick.
  bool tick_pending_ = false;
  // A convergence point the next tick adds: the layers' errors after `batches` batches, left
  // on the device (LayerRelStdErrorTensor).
  struct PendingPoint {
    int64_t batches = 0;
    int64_t samples = 0;
    at::Tensor errors;
  };
  std::vector<PendingPoint> pending_points_;
  // The last batch fed, on the device, until its tick has passed: what a non-finite batch
  // runs again to locate its first NaN or Inf. Released as the next batch comes, before its
  // copy to the device.
  std::vector<at::Tensor> held_args_;
  // Where pinned batches are copied to a GPU (Arguments); none on the CPU.
  std::optional<c10::Stream> copy_stream_;
};

}  // namespace recal::engine
