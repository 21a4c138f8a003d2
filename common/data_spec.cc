#include "common/data_spec.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace recal::data {
namespace {

constexpr absl::string_view kSyntax =
    "expected npy:PATH, safetensors:PATH[:KEY,KEY...], torch:PATH (each with an optional "
    "?scale=S&mean=M,..&std=S,..), synthetic:SHAPE[,seed=S] or "
    "images:DIR[?resize=R&crop=C&mean=M,M,M&std=S,S,S&samples=N&seed=S&shuffle=0|1&on_bad=fail|skip]";

absl::Status Bad(absl::string_view spec, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bad data spec '", spec, "': ", why));
}

// SimpleAtoi alone would also take a sign and surrounding spaces, which no integer of a
// spec has.
bool AllDigits(absl::string_view text) {
  return !text.empty() && text.find_first_not_of("0123456789") == absl::string_view::npos;
}

bool ParsePositive(absl::string_view text, int64_t* out) {
  return AllDigits(text) && absl::SimpleAtoi(text, out) && *out >= 1;
}

absl::Status ParseSeed(absl::string_view spec, absl::string_view text, uint64_t* out) {
  if (!AllDigits(text) || !absl::SimpleAtoi(text, out)) {
    return Bad(spec, absl::StrCat("seed '", text, "' must be a non-negative integer below 2^64"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view spec, absl::string_view text) {
  if (text.empty()) return Bad(spec, "synthetic needs a per-sample SHAPE such as 3x224x224");
  std::vector<int64_t> shape;
  int64_t elements = 1;
  for (absl::string_view part : absl::StrSplit(text, 'x')) {
    int64_t dim = 0;
    if (!ParsePositive(part, &dim)) {
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

// What ParseFinite's numbers must be, for the errors that refuse one.
constexpr char kFloat32Range[] = " (within float32's range: 0, or 1.4e-45 to 3.4e38 in magnitude)";

// A number in decimal notation, [+-](D+[.D*]|.D+)[(e|E)[+-]D+], that a float32 carries: the
// API sends scale, mean and std as floats (recal.v1), and a value beyond float32's range
// would arrive as infinity, or as 0, which for a scale means "none" (1e-50 would silently
// become no scaling at all). SimpleAtod alone would also take surrounding spaces and
// hexadecimal ("0x1p3"), which the Python client refuses.
bool ParseFinite(absl::string_view text, double* out) {
  size_t i = 0;
  const auto digits = [&] {
    const size_t start = i;
    while (i < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[i]))) ++i;
    return i > start;
  };
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  const bool integer_part = digits();
  bool fraction_part = false;
  if (i < text.size() && text[i] == '.') {
    ++i;
    fraction_part = digits();
  }
  if (!integer_part && !fraction_part) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (!digits()) return false;
  }
  if (i != text.size() || !absl::SimpleAtod(text, out) || !std::isfinite(*out)) return false;
  const float carried = static_cast<float>(*out);
  return std::isfinite(carried) && (carried != 0 || *out == 0);
}

// Comma-separated finite numbers (positive ones for std); `count` of them unless 0.
absl::StatusOr<std::vector<double>> ParseNumbers(absl::string_view spec, absl::string_view key,
                                                 absl::string_view text, bool positive, size_t count) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    double v = 0;
    if (!ParseFinite(part, &v) || (positive && v <= 0)) {
      return Bad(spec, absl::StrCat(key, " must be comma-separated ", positive ? "positive " : "", "numbers; found '",
                                    part, "'", kFloat32Range));
    }
    out.push_back(v);
  }
  if (count > 0 && out.size() != count) {
    return Bad(spec, absl::StrCat(key, " must have ", count, " values (one per RGB channel)"));
  }
  return out;
}

struct Option {
  std::string key;
  absl::string_view value;
};

// KEY=VALUE&KEY=VALUE..., each KEY once, in order; empty parts ("DIR?", "&&") are skipped.
// Every option is split before any value is read, so a spec's first error is the same here
// and in the Python client.
absl::StatusOr<std::vector<Option>> SplitOptions(absl::string_view spec, absl::string_view text) {
  std::vector<Option> out;
  std::set<std::string> seen;
  for (absl::string_view option : absl::StrSplit(text, '&', absl::SkipEmpty())) {
    const size_t eq = option.find('=');
    if (eq == absl::string_view::npos) return Bad(spec, absl::StrCat("option '", option, "' is not KEY=VALUE"));
    Option parsed{std::string(option.substr(0, eq)), option.substr(eq + 1)};
    if (!seen.insert(parsed.key).second) return Bad(spec, absl::StrCat("repeated option '", parsed.key, "'"));
    out.push_back(std::move(parsed));
  }
  return out;
}

// The ?scale=S&mean=..&std=.. of a tensor file spec.
absl::Status ParseNormalization(absl::string_view spec, absl::string_view options, DataSpec& out) {
  RECAL_ASSIGN_OR_RETURN(const std::vector<Option> parsed, SplitOptions(spec, options));
  for (const auto& [key, value] : parsed) {
    if (key == "scale") {
      if (!ParseFinite(value, &out.scale) || out.scale <= 0) {
        return Bad(spec, absl::StrCat("scale '", value, "' must be a positive number", kFloat32Range));
      }
    } else if (key == "mean" || key == "std") {
      RECAL_ASSIGN_OR_RETURN((key == "mean" ? out.mean : out.std), ParseNumbers(spec, key, value, key == "std", 0));
    } else {
      return Bad(spec, absl::StrCat("unknown option '", key, "'; tensor files take scale, mean, std"));
    }
  }
  if (out.mean.size() != out.std.size()) {
    return Bad(spec, absl::StrCat("mean has ", out.mean.size(), " values and std ", out.std.size(),
                                  "; give both, one value per channel"));
  }
  return absl::OkStatus();
}

// "s3://" at the start of a path: 5, else 0. Its ':' is part of the path, never a separator.
size_t SchemeLength(absl::string_view path) { return absl::StartsWith(path, "s3://") ? 5 : 0; }

absl::StatusOr<DataSpec> ParseImages(absl::string_view spec, absl::string_view rest) {
  DataSpec out;
  out.scheme = DataSpec::Scheme::kImages;
  const size_t q = std::min(rest.rfind('?'), rest.size());  // no '?': no options
  out.path = std::string(rest.substr(0, q));
  if (out.path.empty()) return Bad(spec, "empty directory after 'images:'");
  const absl::string_view options = q < rest.size() ? rest.substr(q + 1) : absl::string_view();
  RECAL_ASSIGN_OR_RETURN(const std::vector<Option> parsed, SplitOptions(spec, options));
  for (const auto& [key, value] : parsed) {
    if (key == "resize" || key == "crop" || key == "samples") {
      int64_t v = 0;
      if (!ParsePositive(value, &v) || v > (key == "samples" ? std::numeric_limits<int64_t>::max() : kMaxImageSide)) {
        return Bad(spec, absl::StrCat(key, " '", value, "' must be a positive integer",
                                      key == "samples" ? "" : absl::StrCat(" <= ", kMaxImageSide)));
      }
      (key == "resize" ? out.resize : key == "crop" ? out.crop : out.samples) = v;
    } else if (key == "mean" || key == "std") {
      RECAL_ASSIGN_OR_RETURN((key == "mean" ? out.mean : out.std), ParseNumbers(spec, key, value, key == "std", 3));
    } else if (key == "seed") {
      RECAL_RETURN_IF_ERROR(ParseSeed(spec, value, &out.seed));
    } else if (key == "shuffle") {
      if (value != "0" && value != "1") return Bad(spec, absl::StrCat("shuffle '", value, "' must be 0 or 1"));
      out.shuffle = value == "1";
    } else if (key == "on_bad") {
      if (value != "fail" && value != "skip") {
        return Bad(spec, absl::StrCat("on_bad '", value, "' must be fail or skip"));
      }
      out.skip_bad = value == "skip";
    } else {
      return Bad(spec, absl::StrCat("unknown option '", key,
                                    "'; images takes resize, crop, mean, std, samples, seed, shuffle, on_bad"));
    }
  }
  FillImageNetDefaults(&out);
  if (out.crop > out.resize) {
    return Bad(spec, absl::StrCat("crop ", out.crop, " is larger than resize ", out.resize, " (padding is not supported)"));
  }
  return out;
}

std::atomic<int64_t> parse_count{0};

}  // namespace

int64_t ParseDataSpecCount() { return parse_count.load(std::memory_order_relaxed); }

absl::StatusOr<DataSpec> ParseDataSpec(absl::string_view spec) {
  parse_count.fetch_add(1, std::memory_order_relaxed);
  const size_t colon = spec.find(':');
  if (colon == absl::string_view::npos) return Bad(spec, absl::StrCat("no scheme; ", kSyntax));
  const absl::string_view scheme = spec.substr(0, colon);
  absl::string_view rest = spec.substr(colon + 1);
  DataSpec out;
  absl::string_view options;

  if (scheme == "synthetic") {
    out.scheme = DataSpec::Scheme::kSynthetic;
    std::vector<absl::string_view> parts = absl::StrSplit(rest, ',');
    RECAL_ASSIGN_OR_RETURN(out.sample_shape, ParseShape(spec, parts[0]));
    bool have_seed = false;
    for (size_t i = 1; i < parts.size(); ++i) {
      if (!absl::StartsWith(parts[i], "seed=") || have_seed) {
        return Bad(spec, absl::StrCat("unknown or repeated option '", parts[i], "'; the only option is seed=S"));
      }
      RECAL_RETURN_IF_ERROR(ParseSeed(spec, parts[i].substr(5), &out.seed));
      have_seed = true;
    }
    return out;
  }

  if (scheme == "images") return ParseImages(spec, rest);

  if (scheme == "npy") {
    out.scheme = DataSpec::Scheme::kNpy;
  } else if (scheme == "torch") {
    out.scheme = DataSpec::Scheme::kTorch;
  } else if (scheme == "safetensors") {
    out.scheme = DataSpec::Scheme::kSafetensors;
  } else {
    return Bad(spec, absl::StrCat("unknown scheme '", scheme, "'; ", kSyntax));
  }
  if (const size_t q = rest.rfind('?'); q != absl::string_view::npos) {
    options = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (out.scheme == DataSpec::Scheme::kSafetensors) {
    // The colon of an s3:// URL is not the one before the keys.
    const size_t last = rest.rfind(':');
    if (last != absl::string_view::npos && last >= SchemeLength(rest)) {
      const absl::string_view keys = rest.substr(last + 1);
      rest = rest.substr(0, last);
      if (!keys.empty()) {
        for (absl::string_view key : absl::StrSplit(keys, ',')) {
          if (key.empty()) return Bad(spec, "empty key in the key list (KEY,KEY...)");
          out.keys.emplace_back(key);
        }
      }
    }
  }
  if (rest.empty()) return Bad(spec, absl::StrCat("empty path after '", scheme, ":'"));
  out.path = std::string(rest);
  RECAL_RETURN_IF_ERROR(ParseNormalization(spec, options, out));
  return out;
}

double FloatAsDecimal(float value) {
  char text[32];
  const std::to_chars_result written = std::to_chars(text, text + sizeof(text), value);
  double out = value;
  if (written.ec == std::errc()) std::from_chars(text, written.ptr, out);
  return out;
}

namespace {

// The shortest spelling that reads back as the same double (absl's StrCat keeps 6
// significant digits, which would change the numbers of a spec on its way to the server).
std::string Number(double value) {
  char text[32];
  const std::to_chars_result written = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, written.ptr);
}

std::string Numbers(const std::vector<double>& values) {
  return absl::StrJoin(values, ",", [](std::string* out, double v) { out->append(Number(v)); });
}

// "?scale=..&mean=..&std=.." or "" (or "?" alone when the path or a key contains a '?').
std::string NormalizationSuffix(const DataSpec& spec) {
  std::vector<std::string> options;
  if (spec.scale > 0) options.push_back(absl::StrCat("scale=", Number(spec.scale)));
  if (!spec.mean.empty()) options.push_back(absl::StrCat("mean=", Numbers(spec.mean)));
  if (!spec.std.empty()) options.push_back(absl::StrCat("std=", Numbers(spec.std)));
  const bool question_mark = absl::StrContains(spec.path, '?') ||
                             std::any_of(spec.keys.begin(), spec.keys.end(),
                                         [](const std::string& key) { return absl::StrContains(key, '?'); });
  if (options.empty() && !question_mark) return "";
  return absl::StrCat("?", absl::StrJoin(options, "&"));
}

}  // namespace

std::string DataSpecToString(const DataSpec& spec) {
  switch (spec.scheme) {
    case DataSpec::Scheme::kNpy:
      return absl::StrCat("npy:", spec.path, NormalizationSuffix(spec));
    case DataSpec::Scheme::kTorch:
      return absl::StrCat("torch:", spec.path, NormalizationSuffix(spec));
    case DataSpec::Scheme::kSafetensors: {
      std::string out = absl::StrCat("safetensors:", spec.path);
      if (!spec.keys.empty() || absl::StrContains(absl::string_view(spec.path).substr(SchemeLength(spec.path)), ':')) {
        absl::StrAppend(&out, ":", absl::StrJoin(spec.keys, ","));
      }
      return absl::StrCat(out, NormalizationSuffix(spec));
    }
    case DataSpec::Scheme::kSynthetic:
      return absl::StrCat("synthetic:", absl::StrJoin(spec.sample_shape, "x"), ",seed=", spec.seed);
    case DataSpec::Scheme::kImages: {
      std::string out = absl::StrCat("images:", spec.path, "?resize=", spec.resize, "&crop=", spec.crop,
                                     "&mean=", Numbers(spec.mean), "&std=", Numbers(spec.std));
      if (spec.samples >= 0) absl::StrAppend(&out, "&samples=", spec.samples);
      if (spec.shuffle) absl::StrAppend(&out, "&shuffle=1&seed=", spec.seed);
      if (spec.skip_bad) absl::StrAppend(&out, "&on_bad=skip");
      return out;
    }
  }
  return "";
}

void FillImageNetDefaults(DataSpec* spec) {
  // Sides outside 1..kMaxImageSide are left for the checks to refuse, never multiplied (an
  // API message's int64 would overflow).
  const auto in_range = [](int64_t side) { return side >= 1 && side <= kMaxImageSide; };
  if (spec->resize == 0 && spec->crop == 0) {
    spec->resize = kImageNetResize;
    spec->crop = kImageNetCrop;
  } else if (spec->crop == 0) {
    spec->crop = in_range(spec->resize) ? std::max<int64_t>(1, spec->resize * kImageNetCrop / kImageNetResize) : 1;
  } else if (spec->resize == 0) {
    // Within the largest side: a crop near it would otherwise ask for a resize beyond it.
    spec->resize = in_range(spec->crop)
                       ? std::max(spec->crop, std::min(kMaxImageSide, (spec->crop * kImageNetResize + kImageNetCrop - 1) /
                                                                          kImageNetCrop))
                       : kMaxImageSide;
  }
  if (spec->mean.empty()) spec->mean.assign(std::begin(kImageNetMean), std::end(kImageNetMean));
  if (spec->std.empty()) spec->std.assign(std::begin(kImageNetStd), std::end(kImageNetStd));
}

absl::Status ShortDataError(int64_t batches, int64_t samples, int64_t max_batches) {
  return absl::InvalidArgumentError(absl::StrCat(
      "the data has only ", batches, " batches (", samples, " samples), fewer than max_batches=", max_batches,
      "; ask for fewer batches (--max_batches) or use what there is (--allow_short_data; in Python "
      "allow_short_data=True)"));
}

}  // namespace recal::data
