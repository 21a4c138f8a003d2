// The concrete sources behind OpenBatchSource, one per scheme (see data_spec.h). Every
// error names the spec; batch_size must be >= 1.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/data/batch_source.h"

namespace recal::data {

// Memory-mapped; each batch copies only its own rows.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenNpySource(const std::string& path, int64_t batch_size);

// Memory-mapped. `keys` are the positional inputs in order; empty = every tensor in the
// file, sorted by name.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenSafetensorsSource(const std::string& path,
                                                                   const std::vector<std::string>& keys,
                                                                   int64_t batch_size);

// A torch.save'd tensor, or list/tuple of tensors (= positional inputs), in the zip format
// torch.save writes by default since torch 1.6. Unlike the other file sources it is read
// whole into memory: the pickle must be decoded before any tensor can be found.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenTorchSource(const std::string& path, int64_t batch_size);

// Endless float32 N(0, 1) batches of shape [batch_size, sample_shape...]. Batch k depends
// only on (seed, k, batch_size, sample_shape), not on what was read before.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenSyntheticSource(const std::vector<int64_t>& sample_shape,
                                                                 uint64_t seed, int64_t batch_size);

}  // namespace recal::data
