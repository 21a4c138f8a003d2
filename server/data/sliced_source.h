// The one way file-backed sources turn whole tensors into batches: narrow along dim 0 and
// copy that slice into an owned contiguous tensor. The inputs may be views of a memory
// mapping (npy, safetensors) or tensors in memory (torch); `backing` keeps whatever they
// point into alive for as long as the source lives. A file without a mapping (an object in
// a bucket, random_access_file.h) is read by ranges instead: MakeRangedSource.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/data/batch_source.h"
#include "server/data_access/random_access_file.h"

namespace recal::data {

struct NamedInput {
  std::string name;  // for messages: the key, or "input 0"
  at::Tensor tensor;
  int64_t offset = 0;  // MakeRangedSource: the tensor's first byte in the file
};

// Checks that there is at least one input, each with at least one dim, all with the same
// dim 0; errors start with `label` (the spec). Describe() is "<label> (<N> x <per-sample
// shape> <dtype>[, ...])".
absl::StatusOr<std::unique_ptr<BatchSource>> MakeSlicedSource(std::string label,
                                                              std::vector<NamedInput> inputs,
                                                              std::shared_ptr<const void> backing,
                                                              int64_t batch_size);

// The same batches read from `file` by ranges: each input's tensor only describes it (a
// meta tensor: shape and dtype, no storage) and lies dense, row-major at `offset`. Each
// Next() reads exactly the batch's rows of each input (one ReadAt per input) into a new
// tensor; SkipBatches reads nothing. A read error fails that Next() with its code.
absl::StatusOr<std::unique_ptr<BatchSource>> MakeRangedSource(std::string label, std::vector<NamedInput> inputs,
                                                              std::shared_ptr<const RandomAccessFile> file,
                                                              int64_t batch_size);

}  // namespace recal::data
