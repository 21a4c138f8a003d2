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
};

// Opens a data spec: npy:PATH | safetensors:PATH[:key,key...] | torch:PATH |
// synthetic:SHAPE[,seed=S] (SHAPE per sample, e.g. 3x224x224) |
// images:DIR?resize=R&crop=C&mean=..&std=..[&...] (see image_source.h).
absl::StatusOr<std::unique_ptr<BatchSource>> OpenBatchSource(const std::string& spec,
                                                             int64_t batch_size);

}  // namespace recal::data
