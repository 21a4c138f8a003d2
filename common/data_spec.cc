#include "common/data_spec.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace recal::data {
namespace {

constexpr absl::string_view kSyntax =
    "expected npy:PATH, safetensors:PATH[:KEY,KEY...], torch:PATH or synthetic:SHAPE[,seed=S]";

absl::Status Bad(absl::string_view spec, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bad data spec '", spec, "': ", why));
}

absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view spec, absl::string_view text) {
  if (text.empty()) return Bad(spec, "synthetic needs a per-sample SHAPE such as 3x224x224");
  std::vector<int64_t> shape;
  int64_t elements = 1;
  for (absl::string_view part : absl::StrSplit(text, 'x')) {
    int64_t dim = 0;
    // SimpleAtoi accepts a sign and surrounding spaces; a shape has neither.
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == absl::string_view::npos;
    if (!digits || !absl::SimpleAtoi(part, &dim) || dim < 1) {
      return Bad(spec, absl::StrCat("SHAPE '", text, "' must be positive integers joined by 'x' (e.g. 3x224x224); found '", part, "'"));
    }
    if (elements > std::numeric_limits<int32_t>::max() / dim) {
      return Bad(spec, absl::StrCat("SHAPE '", text, "' has more than 2^31 elements per sample"));
    }
    elements *= dim;
    shape.push_back(dim);
  }
  return shape;
}

}  // namespace

absl::StatusOr<DataSpec> ParseDataSpec(absl::string_view spec) {
  const size_t colon = spec.find(':');
  if (colon == absl::string_view::npos) return Bad(spec, absl::StrCat("no scheme; ", kSyntax));
  const absl::string_view scheme = spec.substr(0, colon);
  absl::string_view rest = spec.substr(colon + 1);
  DataSpec out;

  if (scheme == "synthetic") {
    out.scheme = DataSpec::Scheme::kSynthetic;
    std::vector<absl::string_view> parts = absl::StrSplit(rest, ',');
    absl::StatusOr<std::vector<int64_t>> shape = ParseShape(spec, parts[0]);
    if (!shape.ok()) return shape.status();
    out.sample_shape = *std::move(shape);
    bool have_seed = false;
    for (size_t i = 1; i < parts.size(); ++i) {
      if (!absl::StartsWith(parts[i], "seed=") || have_seed) {
        return Bad(spec, absl::StrCat("unknown or repeated option '", parts[i], "'; the only option is seed=S"));
      }
      const absl::string_view value = parts[i].substr(5);
      const bool digits = !value.empty() && value.find_first_not_of("0123456789") == absl::string_view::npos;
      if (!digits || !absl::SimpleAtoi(value, &out.seed)) {
        return Bad(spec, absl::StrCat("seed '", value, "' must be a non-negative integer below 2^64"));
      }
      have_seed = true;
    }
    return out;
  }

  if (scheme == "npy") {
    out.scheme = DataSpec::Scheme::kNpy;
  } else if (scheme == "torch") {
    out.scheme = DataSpec::Scheme::kTorch;
  } else if (scheme == "safetensors") {
    out.scheme = DataSpec::Scheme::kSafetensors;
    const size_t last = rest.rfind(':');
    if (last != absl::string_view::npos) {
      const absl::string_view keys = rest.substr(last + 1);
      rest = rest.substr(0, last);
      if (!keys.empty()) {
        for (absl::string_view key : absl::StrSplit(keys, ',')) {
          if (key.empty()) return Bad(spec, "empty key in the key list (KEY,KEY...)");
          out.keys.emplace_back(key);
        }
      }
    }
  } else {
    return Bad(spec, absl::StrCat("unknown scheme '", scheme, "'; ", kSyntax));
  }
  if (rest.empty()) return Bad(spec, absl::StrCat("empty path after '", scheme, ":'"));
  out.path = std::string(rest);
  return out;
}

std::string DataSpecToString(const DataSpec& spec) {
  switch (spec.scheme) {
    case DataSpec::Scheme::kNpy:
      return absl::StrCat("npy:", spec.path);
    case DataSpec::Scheme::kTorch:
      return absl::StrCat("torch:", spec.path);
    case DataSpec::Scheme::kSafetensors: {
      std::string out = absl::StrCat("safetensors:", spec.path);
      if (!spec.keys.empty() || absl::StrContains(spec.path, ':')) {
        absl::StrAppend(&out, ":", absl::StrJoin(spec.keys, ","));
      }
      return out;
    }
    case DataSpec::Scheme::kSynthetic:
      return absl::StrCat("synthetic:", absl::StrJoin(spec.sample_shape, "x"), ",seed=", spec.seed);
  }
  return "";
}

}  // namespace recal::data
