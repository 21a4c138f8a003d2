// Data-spec strings ("npy:PATH?scale=..", "images:DIR?resize=..", ...) as clients send them
// and recal-run takes them: common/data_spec.cc, the one parser of the syntax.
//
// Contract: garbage is INVALID_ARGUMENT with a message that quotes the spec; a spec that
// parses has sane fields (positive dims, 1 <= crop <= resize, finite numbers, positive std
// and scale, as many means as stds) and its canonical spelling (DataSpecToString) parses back
// to the same spec and spells itself the same way.
#include <cmath>
#include <cstdint>
#include <string>

#include "common/data_spec.h"
#include "fuzz/fuzz_util.h"

namespace {

using recal::data::DataSpec;

void CheckNumbers(const std::vector<double>& values, bool positive, absl::string_view what) {
  for (double v : values) FUZZ_CHECK(std::isfinite(v) && (!positive || v > 0), what, " holds ", v);
}

void CheckFields(const DataSpec& spec) {
  switch (spec.scheme) {
    case DataSpec::Scheme::kSynthetic: {
      FUZZ_CHECK(!spec.sample_shape.empty(), "synthetic without a shape");
      int64_t elements = 1;
      for (int64_t d : spec.sample_shape) {
        FUZZ_CHECK(d >= 1 && d <= INT32_MAX / elements, "synthetic dim ", d);
        elements *= d;
      }
      break;
    }
    case DataSpec::Scheme::kImages:
      FUZZ_CHECK(!spec.path.empty(), "images without a directory");
      FUZZ_CHECK(1 <= spec.crop && spec.crop <= spec.resize && spec.resize <= 65536, "crop/resize");
      FUZZ_CHECK(spec.mean.size() == 3 && spec.std.size() == 3, "images mean/std count");
      FUZZ_CHECK(spec.samples == -1 || spec.samples >= 1, "samples ", spec.samples);
      break;
    case DataSpec::Scheme::kNpy:
    case DataSpec::Scheme::kSafetensors:
    case DataSpec::Scheme::kTorch:
      FUZZ_CHECK(!spec.path.empty(), "a file scheme without a path");
      FUZZ_CHECK(spec.mean.size() == spec.std.size(), "mean/std count");
      FUZZ_CHECK(spec.scale == 0 || (std::isfinite(spec.scale) && spec.scale > 0), "scale ", spec.scale);
      if (spec.scheme != DataSpec::Scheme::kSafetensors) FUZZ_CHECK(spec.keys.empty(), "keys outside safetensors");
      for (const std::string& key : spec.keys) FUZZ_CHECK(!key.empty(), "an empty key");
      break;
  }
  CheckNumbers(spec.mean, false, "mean");
  CheckNumbers(spec.std, true, "std");
}

bool SameSpec(const DataSpec& a, const DataSpec& b) {
  // The seed of an unshuffled image folder does nothing and is not spelled.
  const bool seed_matters = a.scheme == DataSpec::Scheme::kSynthetic || a.shuffle;
  return a.scheme == b.scheme && a.path == b.path && a.keys == b.keys && a.sample_shape == b.sample_shape &&
         (!seed_matters || a.seed == b.seed) && a.resize == b.resize && a.crop == b.crop && a.mean == b.mean &&
         a.std == b.std && a.scale == b.scale && a.samples == b.samples && a.shuffle == b.shuffle &&
         a.skip_bad == b.skip_bad;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = recal::data::ParseDataSpec(text);
  if (!spec.ok()) {
    recal::fuzz::CheckRefusal(spec.status(), "ParseDataSpec");
    FUZZ_CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument, spec.status().ToString());
    return 0;
  }
  CheckFields(*spec);
  const std::string canonical = recal::data::DataSpecToString(*spec);
  auto again = recal::data::ParseDataSpec(canonical);
  FUZZ_CHECK(again.ok(), "the canonical spelling '", canonical, "' does not parse: ", again.status().ToString());
  FUZZ_CHECK(SameSpec(*spec, *again), "'", canonical, "' parses to another spec");
  FUZZ_CHECK(recal::data::DataSpecToString(*again) == canonical, "'", canonical, "' is not canonical");
  return 0;
}
