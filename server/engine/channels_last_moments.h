// Per-channel batch statistics of a channels-last float32 activation, precise and in one
// pass: what LibTorch's fused channels-last batch norm does not give (collector.cc).
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>

namespace recal::engine {

// The float64 mean and biased variance per channel (dim 1) of a float32 CPU tensor laid out
// channels-last (ChannelsLast or ChannelsLast3d), with at least one value per channel.
std::pair<at::Tensor, at::Tensor> ChannelsLastMoments(const at::Tensor& input);

}  // namespace recal::engine
