// The concrete sources behind OpenBatchSource, one per scheme (see data_spec.h). Every
// error names the spec; batch_size must be >= 1.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/data/batch_source.h"
#include "server/data_access/random_access_file.h"

namespace recal::data {

// Memory-mapped; each batch copies only its own rows.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenNpySource(const std::string& path, int64_t batch_size);
// The same over any file (random_access_file.h): a mapped one as above, else the header
// in one or two reads and each batch's rows in one read.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenNpySource(std::shared_ptr<const RandomAccessFile> file,
                                                           int64_t batch_size);

// Memory-mapped. `keys` are the positional inputs in order; empty = every tensor in the
// file, sorted by name.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenSafetensorsSource(const std::string& path,
                                                                   const std::vector<std::string>& keys,
                                                                   int64_t batch_size);
// The same over any file, as OpenNpySource: one read per key per batch when not mapped.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenSafetensorsSource(std::shared_ptr<const RandomAccessFile> file,
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
