// What the server does to input tensors before the forward pass, so that clients and files
// can carry compact uint8 / float16 data: those become float32, and, if asked, are scaled
// and normalised per channel. One implementation for tensor files and the client stream.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "common/input_contract.h"
#include "server/data/batch_source.h"

namespace recal::data {

struct Normalization {
  double scale = 0;                // divide by it first; 0: do not
  std::vector<double> mean, std;   // per channel of dim 1; both empty: do not normalise
};

// uint8, float16 and float32 inputs become float32 (x / scale - mean) / std; others (int64
// token ids, float64, bfloat16, bool) pass unchanged. INVALID_ARGUMENT when mean/std do
// not match the input's channels (dim 1). `x` is not modified.
absl::StatusOr<at::Tensor> ToModelInput(const at::Tensor& x, const Normalization& normalization);

// ToModelInput on every tensor of every batch of `inner`.
std::unique_ptr<BatchSource> Normalized(std::unique_ptr<BatchSource> inner, Normalization normalization);

// Floating inputs of another floating dtype than the one `inputs` (a program's contract)
// names are cast to it here, before the forward: the forward then sees the program's dtype,
// so that its layout is chosen for that dtype (a float64 file for a float32 program runs
// channels-last where float32 data does, not contiguous). `note` is called once per input it
// casts, at its first batch, with common/input_contract.h's CastNotes line. Inputs with no
// floating dtype in the contract (TorchScript's, token ids) pass as they are.
std::unique_ptr<BatchSource> CastToModelDtypes(std::unique_ptr<BatchSource> inner, const ModelInputs& inputs,
                                               std::function<void(const std::string&)> note = nullptr);

}  // namespace recal::data
