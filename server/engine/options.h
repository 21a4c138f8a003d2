// What a caller can choose about one recalibration.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data_spec.h"
#include "recal/v1/report.pb.h"
#include "server/engine/graph_validation.h"

namespace recal::engine {

// How 4-d floating-point activations are laid out during the forward. channels_last: inputs
// and 4-d weights converted; contiguous: both as they come (the input pipeline's batches are
// contiguous); auto: channels-last where it was measured faster (AutoMemoryFormat in
// recalibration.cc), decided at the first batch.
enum class MemoryFormat { kAuto, kContiguous, kChannelsLast };

// Names: v1::MemoryFormat's, lowercase (common/enum_names.h). MEMORY_FORMAT_UNSPECIFIED is auto.
MemoryFormat MemoryFormatOf(v1::MemoryFormat format);
absl::StatusOr<MemoryFormat> ParseMemoryFormat(absl::string_view name);
std::string MemoryFormatName(MemoryFormat format);

// The precision the forward computes in. float32: the model as it is (exact, the default).
// bfloat16 / float16: under autocast (CPU: bfloat16 only; CUDA: both), so convolutions and
// matrix products run in that type, as in a model deployed that way; every BatchNorm's
// statistics are still accumulated in float64 from the activations it actually sees.
enum class ComputeDtype { kFloat32, kBFloat16, kFloat16 };

// Names: v1::ComputeDtype's, lowercase (common/enum_names.h). COMPUTE_DTYPE_UNSPECIFIED is float32.
ComputeDtype ComputeDtypeOf(v1::ComputeDtype dtype);
absl::StatusOr<ComputeDtype> ParseComputeDtype(absl::string_view name);
std::string ComputeDtypeName(ComputeDtype dtype);

struct Options {
  v1::Estimator estimator = v1::POPULATION;
  v1::ModuleMode modules = v1::EVAL;
  // Layers (module paths, e.g. "layer1.0.bn1") to recalibrate: those matching `include`
  // (empty = all) and not matching `exclude` (empty = none). ECMAScript regular
  // expressions, searched anywhere in the name (as Python's re.search).
  std::string include;
  std::string exclude;
  // Batches to use. Unset: up to kDefaultMaxBatches, fewer if the data ends first. Set: the
  // data must have that many unless allow_short_data.
  std::optional<int64_t> max_batches;
  bool allow_short_data = false;
  // Stop once every layer's statistics have this relative standard error (0 = never),
  // judged after at least min_batches_for_target batches.
  double target_rel_error = 0;
  int64_t min_batches_for_target = 10;
  std::string device = "cpu";  // "cpu" or "cuda:N"
  int threads = 0;             // intra-op threads; 0 = LibTorch's default
  GraphPolicy graph_policy;    // what the model's graphs may do (server/engine/graph_validation.h)
  MemoryFormat memory_format = MemoryFormat::kAuto;
  ComputeDtype compute_dtype = ComputeDtype::kFloat32;
  // false: the forward runs under at::NoGradGuard instead of c10::InferenceMode, only so
  // that bench/forward_levers can measure what inference mode gains.
  bool inference_mode = true;
  // true: the forward ends at the last observed BatchNorm (InstrumentForward); false only
  // so that bench/forward_levers and the tests can compare with the whole forward.
  bool end_at_last_batch_norm = true;
  // Passes over the data (1 to limits::kMaxIterations), each after the first with the
  // statistics of the one before written into the model's running buffers: a forward that
  // reads them (a quantization-aware Conv-BN scales its weight by the running variance) makes
  // one pass one re-estimation step. Recalibration::RunPasses runs them.
  int iterations = 1;
  // true: the copy of the archive that WriteModel writes is loaded on a thread of its own
  // while this run instruments and feeds the observed copy, so the load is off the critical
  // path; false for a run that never writes the model (inspection, shards that hand over
  // their statistics), which then does not pay for it.
  bool preload_output_copy = true;
  // Batches between progress ticks, where the host reads what the batches left on the device
  // (non-finite flags, convergence points, the error that progress reports and
  // target_rel_error judges): 0 picks ProgressTickBatches(device); the tests set it to run
  // the GPU's schedule on the CPU. The first batch and the last of a pass always tick.
  int64_t progress_tick_batches = 0;
};

// The progress tick on a GPU, in batches: each tick waits for the GPU to drain (a host
// synchronisation), so it comes every few batches rather than every one; counted in batches,
// never in time, so that what a run computes and where it stops do not depend on timing.
inline constexpr int64_t kGpuProgressTickBatches = 8;

// Options::progress_tick_batches when it is 0: every batch on the CPU (a sync costs nothing
// there), kGpuProgressTickBatches elsewhere.
int64_t ProgressTickBatches(const Options& options, bool on_cpu);

// fvcore's default number of batches for precise BN (common/data_spec.h).
inline constexpr int64_t kDefaultMaxBatches = data::kDefaultMaxBatches;

// The options of one shard of a sharded run that feeds `batches` batches: exactly those,
// and a precision target scaled so that the merged statistics meet the job's (the
// standard error of K equal shards merged is 1/sqrt(K) of one shard's).
Options ShardOptions(Options options, int shards, int64_t batches);

}  // namespace recal::engine
