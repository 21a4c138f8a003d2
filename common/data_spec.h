// Data specs name a source in one string, as clients send them:
//   npy:PATH
//   safetensors:PATH[:KEY,KEY...]   no keys: every tensor, sorted by name. The keys start
//                                   after the last ':', so a PATH containing ':' needs a
//                                   trailing ':' ("safetensors:/a:b.st:" = all of /a:b.st).
//   torch:PATH                      a torch.save'd tensor, or a list/tuple of tensors
//   synthetic:SHAPE[,seed=S]        SHAPE per sample, e.g. 3x224x224; S defaults to 0
// Parsing only checks the syntax; the files are looked at when the source is opened.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal::data {

struct DataSpec {
  enum class Scheme { kNpy, kSafetensors, kTorch, kSynthetic };
  Scheme scheme = Scheme::kNpy;
  std::string path;                   // file schemes
  std::vector<std::string> keys;      // safetensors; empty = all tensors
  std::vector<int64_t> sample_shape;  // synthetic
  uint64_t seed = 0;                  // synthetic
};

// INVALID_ARGUMENT with the offending spec quoted and the expected syntax.
absl::StatusOr<DataSpec> ParseDataSpec(absl::string_view spec);

// The canonical spelling (e.g. what Describe() starts with).
std::string DataSpecToString(const DataSpec& spec);

}  // namespace recal::data
