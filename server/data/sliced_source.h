// The one way file-backed sources turn whole tensors into batches: narrow along dim 0 and
// copy that slice into an owned contiguous tensor. The inputs may be views of a memory
// mapping (npy, safetensors) or tensors in memory (torch); `backing` keeps whatever they
// point into alive for as long as the source lives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/data/batch_source.h"

namespace recal::data {

struct NamedInput {
  std::string name;  // for messages: the key, or "input 0"
  at::Tensor tensor;
};

// Checks that there is at least one input, each with at least one dim, all with the same
// dim 0; errors start with `label` (the spec). Describe() is "<label> (<N> x <per-sample
// shape> <dtype>[, ...])".
absl::StatusOr<std::unique_ptr<BatchSource>> MakeSlicedSource(std::string label,
                                                              std::vector<NamedInput> inputs,
                                                              std::shared_ptr<const void> backing,
                                                              int64_t batch_size);

}  // namespace recal::data
