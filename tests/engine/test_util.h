// Helpers shared by the engine tests: temp files, tiny modules defined in C++, reading
// safetensors back.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <torch/script.h>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"

namespace recal::engine::testing {

// Saves `module` with torch::jit's own writer and returns the path.
std::string SaveModule(const torch::jit::Module& module, const std::string& path);

// A module `bn` holding running statistics for `channels` channels (mean 0.5, var 2) and
// an affine transform, whose forward calls torch.batch_norm on its input.
torch::jit::Module MakeBatchNorm(int64_t channels);

// Every tensor of a safetensors file, as owned tensors.
std::map<std::string, at::Tensor> ReadSafetensors(const std::string& path);

// The agreed metric against a float64 reference, over every running-mean/var pair of
// `reference` (state_dict keys), in units of the relative tolerance: |Δmean| / max(|mean|,
// std) and |Δvar| / var. Keys missing from `got` count as infinitely wrong.
double WorstRelativeError(const std::map<std::string, at::Tensor>& got,
                          const std::map<std::string, at::Tensor>& reference);

// A tensor as PushBatches carries it (uint8, float16, else float32).
v1::Tensor ToProto(const at::Tensor& t);

// Feeds `batches` to Next() one after the other.
std::function<absl::StatusOr<std::optional<std::vector<at::Tensor>>>()> FeedFrom(
    std::vector<at::Tensor> batches);

}  // namespace recal::engine::testing
