// A data source cut into batches. A batch is the list of positional inputs of one forward
// call; every tensor in it has the same leading (batch) dimension.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "server/data_access/locate_objects.h"

namespace recal::data {

using Batch = std::vector<at::Tensor>;

class BatchSource {
 public:
  virtual ~BatchSource() = default;

  // The next batch (at most batch_size samples; the last one may be shorter), or
  // std::nullopt once the source is exhausted. Tensors are owned, contiguous, on the CPU.
  virtual absl::StatusOr<std::optional<Batch>> Next() = 0;

  // Samples in the whole source, or std::nullopt for an endless one (synthetic).
  virtual std::optional<int64_t> num_samples() const = 0;

  // One line for logs and errors, e.g. "npy:/data/x.npy (1000 x 3x224x224 float32)".
  virtual std::string Describe() const = 0;

  // Files left out so far as corrupt or not images (image folders with on_bad=skip), in the
  // batches returned by Next() up to now.
  virtual int64_t skipped_files() const { return 0; }

  // Passes over the next `batches` batches (fewer if the source ends first). Called before
  // the first Next(), sources skip without reading what they skip; else Next() is called.
  virtual absl::Status SkipBatches(int64_t batches);
};

// How batches are prepared ahead of the forward pass, and where their data may come from.
struct InputOptions {
  int prefetch_depth = 2;   // batches prepared ahead on a background thread; 0: none
  int decode_threads = 0;   // image folders: decoding threads; 0: hardware concurrency, at most 8
  bool pin_memory = false;  // page-locked batches, for non-blocking copies to a CUDA device
  // The data roots that confine the spec and the bucket s3:// specs are read from
  // (server/data_access/locate_objects.h); none by default.
  DataAccess access;
};

// Opens a data spec (common/data_spec.h) as the whole input pipeline: the source
// (image_source.h, sources.h), the conversion of uint8/float16 inputs with the spec's
// scale/mean/std (normalization.h), and the read-ahead (prefetcher.h).
absl::StatusOr<std::unique_ptr<BatchSource>> OpenBatchSource(const DataSpec& spec, int64_t batch_size,
                                                             const InputOptions& options = {});
// The same for a spec as text (recal-run's --data, tests), parsed here, at that edge.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenBatchSource(const std::string& spec, int64_t batch_size,
                                                             const InputOptions& options = {});

// How a sharded job splits its data: on batch boundaries, so that every batch is the one
// the unsharded job would see, into contiguous runs: of the B batches the whole job uses,
// shard k of K takes [k*B/K, (k+1)*B/K). B is what an unsharded run would feed: every
// batch of the data up to max_batches (or default_batches when max_batches is 0); an
// endless source gives exactly that many.
struct ShardPlan {
  int index = 0;
  int count = 1;
  int64_t max_batches = 0;
  int64_t default_batches = 200;
  bool allow_short_data = false;  // else a source with fewer than max_batches batches fails
};

struct BatchRange {
  int64_t first = 0;
  int64_t count = 0;
};

// INVALID_ARGUMENT for a plan that does not fit the data (see ShardPlan).
absl::StatusOr<BatchRange> ShardBatchRange(std::optional<int64_t> num_samples, int64_t batch_size,
                                           const ShardPlan& plan);

struct ShardOfData {
  std::unique_ptr<BatchSource> source;  // ends after range.count batches
  BatchRange range;
};

// OpenBatchSource for one shard: the source starts at the shard's first batch, without
// reading (or decoding) what comes before.
absl::StatusOr<ShardOfData> OpenBatchSourceShard(const DataSpec& spec, int64_t batch_size,
                                                 const InputOptions& options, const ShardPlan& plan);
absl::StatusOr<ShardOfData> OpenBatchSourceShard(const std::string& spec, int64_t batch_size,
                                                 const InputOptions& options, const ShardPlan& plan);

}  // namespace recal::data
