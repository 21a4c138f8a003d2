#include "server/jobs/data_source_spec.h"

#include <cmath>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data_spec.h"
#include "server/data/data_roots.h"

namespace recal::jobs {
namespace {

using data::DataSpec;

constexpr int64_t kMaxImageSide = 65536;  // what the images: spec accepts for resize and crop

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

// `values` as doubles (see FloatAsDecimal), or INVALID_ARGUMENT naming `field` when one is
// not finite, or not positive with `positive`.
absl::StatusOr<std::vector<double>> Decimals(const google::protobuf::RepeatedField<float>& values,
                                             absl::string_view field, bool positive) {
  std::vector<double> out;
  for (int i = 0; i < values.size(); ++i) {
    const float v = values[i];
    if (!std::isfinite(v) || (positive && v <= 0)) {
      return Invalid(absl::StrCat(field, "[", i, "] is ", v, "; ", field, " takes finite",
                                  positive ? ", positive" : "", " numbers"));
    }
    out.push_back(data::FloatAsDecimal(v));
  }
  return out;
}

// The scale/mean/std of a tensor file (the same rules as ClientStreamSource's).
absl::Status FillNormalization(const v1::TensorFileSource& file, DataSpec& spec) {
  if (!std::isfinite(file.scale()) || file.scale() < 0) {
    return Invalid(absl::StrCat("tensor_file.scale is ", file.scale(), "; it must be >= 0 (0 means 1)"));
  }
  spec.scale = data::FloatAsDecimal(file.scale());
  if (file.mean_size() != file.std_size()) {
    return Invalid(absl::StrCat("tensor_file.mean has ", file.mean_size(), " values and tensor_file.std ",
                                file.std_size(), "; give both, one value per channel, or neither"));
  }
  absl::StatusOr<std::vector<double>> mean = Decimals(file.mean(), "tensor_file.mean", false);
  if (!mean.ok()) return mean.status();
  absl::StatusOr<std::vector<double>> std = Decimals(file.std(), "tensor_file.std", true);
  if (!std.ok()) return std.status();
  spec.mean = *std::move(mean);
  spec.std = *std::move(std);
  return absl::OkStatus();
}

absl::StatusOr<DataSpec> TensorFileSpec(const v1::TensorFileSource& file,
                                        const std::vector<std::string>& data_roots) {
  DataSpec spec;
  switch (file.format()) {
    case v1::TensorFileSource::NPY:
      spec.scheme = DataSpec::Scheme::kNpy;
      break;
    case v1::TensorFileSource::SAFETENSORS:
      spec.scheme = DataSpec::Scheme::kSafetensors;
      break;
    case v1::TensorFileSource::TORCH:
      spec.scheme = DataSpec::Scheme::kTorch;
      break;
    default:
      return Invalid("tensor_file.format must be NPY, SAFETENSORS or TORCH");
  }
  if (!file.keys().empty() && spec.scheme != DataSpec::Scheme::kSafetensors) {
    return Invalid("tensor_file.keys apply to SAFETENSORS files only");
  }
  for (const std::string& key : file.keys()) {
    // A spec lists keys after the path's last ':', separated by ','.
    if (key.empty() || absl::StrContains(key, ',') || absl::StrContains(key, ':')) {
      return Invalid(absl::StrCat("tensor_file.keys: '", key,
                                  "' cannot be served (a key must be non-empty, without ',' or ':')"));
    }
    spec.keys.push_back(key);
  }
  if (absl::Status s = FillNormalization(file, spec); !s.ok()) return s;
  absl::StatusOr<std::string> path = data::ResolveUnderRoots(data_roots, file.path());
  if (!path.ok()) return path.status();
  spec.path = *std::move(path);
  return spec;
}

absl::StatusOr<DataSpec> ImageFolderSpec(const v1::ImageFolderSource& folder,
                                         const std::vector<std::string>& data_roots) {
  DataSpec spec;
  spec.scheme = DataSpec::Scheme::kImages;
  if (folder.resize() < 1 || folder.resize() > kMaxImageSide) {
    return Invalid(absl::StrCat("image_folder.resize is ", folder.resize(), "; it must be in 1..", kMaxImageSide,
                                " (the shorter side after resizing)"));
  }
  if (folder.crop() < 1 || folder.crop() > folder.resize()) {
    return Invalid(absl::StrCat("image_folder.crop is ", folder.crop(), "; it must be in 1..resize (",
                                folder.resize(), "): the center crop cannot pad"));
  }
  spec.resize = folder.resize();
  spec.crop = folder.crop();
  if (folder.mean_size() != 3 || folder.std_size() != 3) {
    return Invalid(absl::StrCat("image_folder.mean and image_folder.std must have 3 values each (one per RGB "
                                "channel); got ", folder.mean_size(), " and ", folder.std_size()));
  }
  absl::StatusOr<std::vector<double>> mean = Decimals(folder.mean(), "image_folder.mean", false);
  if (!mean.ok()) return mean.status();
  absl::StatusOr<std::vector<double>> std = Decimals(folder.std(), "image_folder.std", true);
  if (!std.ok()) return std.status();
  spec.mean = *std::move(mean);
  spec.std = *std::move(std);
  if (folder.samples() < 0) {
    return Invalid(absl::StrCat("image_folder.samples is ", folder.samples(), "; it must be >= 0 (0: all)"));
  }
  spec.samples = folder.samples() > 0 ? folder.samples() : -1;
  spec.shuffle = folder.shuffle();
  spec.seed = folder.seed();
  switch (folder.on_bad()) {
    case v1::ImageFolderSource::ON_BAD_UNSPECIFIED:
    case v1::ImageFolderSource::FAIL:
      spec.skip_bad = false;
      break;
    case v1::ImageFolderSource::SKIP:
      spec.skip_bad = true;
      break;
    default:
      return Invalid(absl::StrCat("image_folder.on_bad is ", folder.on_bad(), "; it must be FAIL or SKIP"));
  }
  absl::StatusOr<std::string> path = data::ResolveUnderRoots(data_roots, folder.path());
  if (!path.ok()) return path.status();
  std::error_code error;
  if (!std::filesystem::is_directory(*path, error)) {
    return Invalid(absl::StrCat("image_folder.path ", folder.path(), " is not a directory"));
  }
  spec.path = *std::move(path);
  return spec;
}

absl::StatusOr<DataSpec> SyntheticSpec(const v1::SyntheticSource& synthetic) {
  if (synthetic.sample_shape().empty()) return Invalid("synthetic.sample_shape is empty");
  DataSpec spec;
  spec.scheme = DataSpec::Scheme::kSynthetic;
  for (int64_t d : synthetic.sample_shape()) {
    if (d <= 0) return Invalid("synthetic.sample_shape dims must be positive");
    spec.sample_shape.push_back(d);
  }
  // The seed is int64 in the API and uint64 in specs; clients store a spec's seed bit for
  // bit (DataSourceFromSpec), so the cast back gives the seed they were given.
  spec.seed = static_cast<uint64_t>(synthetic.seed());
  return spec;
}

}  // namespace

absl::StatusOr<std::string> DataSpecFor(const v1::DataSource& source,
                                        const std::vector<std::string>& data_roots) {
  absl::StatusOr<DataSpec> spec;
  switch (source.source_case()) {
    case v1::DataSource::kTensorFile:
      spec = TensorFileSpec(source.tensor_file(), data_roots);
      break;
    case v1::DataSource::kImageFolder:
      spec = ImageFolderSpec(source.image_folder(), data_roots);
      break;
    case v1::DataSource::kSynthetic:
      spec = SyntheticSpec(source.synthetic());
      break;
    case v1::DataSource::kClientStream:
      return std::string(kClientStreamSpec);
    default:
      return Invalid("the job spec names no data source");
  }
  if (!spec.ok()) return spec.status();
  std::string text = data::DataSpecToString(*spec);
  // The data layer parses the string again when the job runs: what it would refuse then
  // (e.g. a synthetic sample of more than 2^31 elements) is refused now, at submit.
  if (absl::Status parsed = data::ParseDataSpec(text).status(); !parsed.ok()) return parsed;
  return text;
}

}  // namespace recal::jobs
