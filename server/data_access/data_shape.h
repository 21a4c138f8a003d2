// What a data spec's batches will hold, known before any is read (common/input_contract.h's
// DataShape): for the up-front check of data against a model's input contract, at submit in
// recal-server (no LibTorch) and in recal-run.
#pragma once

#include <optional>

#include "common/data_spec.h"
#include "common/input_contract.h"

namespace recal::data {

// Per input, one sample's sizes and the dtype the model gets (DtypeReachingModel), and the
// sample count where it is exact:
//   synthetic: its shape, float32, endless;
//   images: [3, crop, crop] float32 (count unknown: the folder is not listed here);
//   local npy and safetensors files: their headers (the keys asked for, or every tensor by
//   name), the count when every tensor has the same dim 0.
// std::nullopt where it is not known without reading the data (torch: files, objects in a
// bucket, a header that does not parse: the batches are checked as they come).
std::optional<DataShape> PeekDataShape(const DataSpec& spec);

// CheckData for what PeekDataShape knows of `spec` (OK where it knows nothing): refused,
// the message names the spec.
absl::Status CheckDataShape(const ModelInputs& inputs, const DataSpec& spec, int64_t batch_size,
                            int64_t max_batches);

}  // namespace recal::data
