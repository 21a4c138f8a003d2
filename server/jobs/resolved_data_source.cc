#include "server/jobs/resolved_data_source.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/data_source.h"
#include "common/data_spec.h"
#include "common/status_macros.h"
#include "common/tenant_name.h"
#include "server/data_access/data_roots.h"
#include "server/data_access/s3_paths.h"

namespace recal::jobs {
namespace {

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

// INVALID_ARGUMENT naming `field` when a value is not finite, or not positive with `positive`.
absl::Status CheckNumbers(const google::protobuf::RepeatedField<float>& values, absl::string_view field,
                          bool positive) {
  for (int i = 0; i < values.size(); ++i) {
    const float v = values[i];
    if (!std::isfinite(v) || (positive && v <= 0)) {
      return Invalid(absl::StrCat(field, "[", i, "] is ", v, "; ", field, " takes finite",
                                  positive ? ", positive" : "", " numbers"));
    }
  }
  return absl::OkStatus();
}

// The scale/mean/std of a tensor file or a client stream (`source` names which): a std of 0
// would turn every pushed or read sample into infinities, found only when the job runs.
template <typename Source>
absl::Status CheckNormalization(const Source& source, absl::string_view name) {
  if (!std::isfinite(source.scale()) || source.scale() < 0) {
    return Invalid(absl::StrCat(name, ".scale is ", source.scale(), "; it must be >= 0 (0 means 1)"));
  }
  if (source.mean_size() != source.std_size()) {
    return Invalid(absl::StrCat(name, ".mean has ", source.mean_size(), " values and ", name, ".std ",
                                source.std_size(), "; give both, one value per channel, or neither"));
  }
  if (absl::Status s = CheckNumbers(source.mean(), absl::StrCat(name, ".mean"), false); !s.ok()) return s;
  return CheckNumbers(source.std(), absl::StrCat(name, ".std"), true);
}

// Each Check* refuses what no data layer could serve, naming the field, then resolves the
// path under the data roots: the resolved path, or why not.
absl::StatusOr<std::string> CheckTensorFile(const v1::TensorFileSource& file,
                                            const std::vector<std::string>& data_roots) {
  switch (file.format()) {
    case v1::TensorFileSource::NPY:
    case v1::TensorFileSource::TORCH:
      if (!file.keys().empty()) return Invalid("tensor_file.keys apply to SAFETENSORS files only");
      break;
    case v1::TensorFileSource::SAFETENSORS:
      break;
    default:
      return Invalid("tensor_file.format must be NPY, SAFETENSORS or TORCH");
  }
  for (const std::string& key : file.keys()) {
    // A spec lists keys after the path's last ':', separated by ','.
    if (key.empty() || absl::StrContains(key, ',') || absl::StrContains(key, ':')) {
      return Invalid(absl::StrCat("tensor_file.keys: '", key,
                                  "' cannot be served (a key must be non-empty, without ',' or ':')"));
    }
  }
  if (absl::Status s = CheckNormalization(file, "tensor_file"); !s.ok()) return s;
  if (file.format() == v1::TensorFileSource::TORCH && data::IsS3Path(file.path())) {
    return Invalid("tensor_file.path: TORCH files are read from local paths only (they are unpickled whole); use NPY "
                   "or SAFETENSORS in a bucket");
  }
  return data::ResolveUnderRoots(data_roots, file.path());
}

absl::StatusOr<std::string> CheckImageFolder(const v1::ImageFolderSource& given,
                                             const std::vector<std::string>& data_roots) {
  const v1::ImageFolderSource folder = data::WithImageNetDefaults(given);
  if (folder.resize() < 1 || folder.resize() > data::kMaxImageSide) {
    return Invalid(absl::StrCat("image_folder.resize is ", folder.resize(), "; it must be in 1..", data::kMaxImageSide,
                                " (the shorter side after resizing)"));
  }
  if (folder.crop() < 1 || folder.crop() > folder.resize()) {
    return Invalid(absl::StrCat("image_folder.crop is ", folder.crop(), "; it must be in 1..resize (",
                                folder.resize(), "): the center crop cannot pad"));
  }
  if (folder.mean_size() != 3 || folder.std_size() != 3) {
    return Invalid(absl::StrCat("image_folder.mean and image_folder.std must have 3 values each (one per RGB "
                                "channel); got ", folder.mean_size(), " and ", folder.std_size()));
  }
  if (absl::Status s = CheckNumbers(folder.mean(), "image_folder.mean", false); !s.ok()) return s;
  if (absl::Status s = CheckNumbers(folder.std(), "image_folder.std", true); !s.ok()) return s;
  if (folder.samples() < 0) {
    return Invalid(absl::StrCat("image_folder.samples is ", folder.samples(), "; it must be >= 0 (0: all)"));
  }
  if (!v1::ImageFolderSource::OnBad_IsValid(folder.on_bad())) {
    return Invalid(absl::StrCat("image_folder.on_bad is ", folder.on_bad(), "; it must be FAIL or SKIP"));
  }
  absl::StatusOr<std::string> path = data::ResolveUnderRoots(data_roots, folder.path());
  if (!path.ok()) return path.status();
  // A prefix in a bucket is listed by the worker's runner when the job runs (NOT_FOUND then
  // if it holds no images): the api asks nothing of the endpoint.
  if (data::IsS3Path(*path)) return path;
  std::error_code error;
  if (!std::filesystem::is_directory(*path, error)) {
    return Invalid(absl::StrCat("image_folder.path ", folder.path(), " is not a directory"));
  }
  return path;
}

absl::Status CheckSynthetic(const v1::SyntheticSource& synthetic) {
  if (synthetic.sample_shape().empty()) return Invalid("synthetic.sample_shape is empty");
  int64_t elements = 1;
  for (int64_t d : synthetic.sample_shape()) {
    if (d <= 0) return Invalid("synthetic.sample_shape dims must be positive");
    // A sample the data layer indexes with 32-bit offsets, as ParseDataSpec refuses in a spec.
    if (elements > std::numeric_limits<int32_t>::max() / d) {
      return Invalid("synthetic.sample_shape has more than 2^31 elements per sample");
    }
    elements *= d;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::DataSource> ResolveDataSource(const v1::DataSource& source,
                                                 const std::vector<std::string>& data_roots) {
  v1::DataSource resolved = source;
  switch (source.source_case()) {
    case v1::DataSource::kTensorFile: {
      RECAL_ASSIGN_OR_RETURN(std::string path, CheckTensorFile(source.tensor_file(), data_roots));
      resolved.mutable_tensor_file()->set_path(std::move(path));
      return resolved;
    }
    case v1::DataSource::kImageFolder: {
      RECAL_ASSIGN_OR_RETURN(std::string path, CheckImageFolder(source.image_folder(), data_roots));
      *resolved.mutable_image_folder() = data::WithImageNetDefaults(source.image_folder());
      resolved.mutable_image_folder()->set_path(std::move(path));
      return resolved;
    }
    case v1::DataSource::kSynthetic:
      RECAL_RETURN_IF_ERROR(CheckSynthetic(source.synthetic()));
      return resolved;
    case v1::DataSource::kClientStream:
      RECAL_RETURN_IF_ERROR(CheckNormalization(source.client_stream(), "client_stream"));
      return resolved;
    default:
      return Invalid("the job spec names no data source");
  }
}

std::vector<std::string> DataRoots::For(const std::string& tenant) const {
  std::vector<std::string> roots = shared;
  auto own = by_tenant.find(tenant);
  if (own != by_tenant.end()) roots.insert(roots.end(), own->second.begin(), own->second.end());
  return roots;
}

std::vector<std::string> DataRoots::All() const {
  std::vector<std::string> roots = shared;
  for (const auto& [tenant, own] : by_tenant) roots.insert(roots.end(), own.begin(), own.end());
  return roots;
}

void DataRoots::Add(const std::string& flag_value) {
  absl::string_view paths = flag_value;
  std::vector<std::string>* into = &shared;
  const size_t equals = paths.find('=');
  if (equals != absl::string_view::npos) {
    const absl::string_view tenant = paths.substr(0, equals);
    const bool is_tenant = IsTenantName(tenant);
    if (is_tenant) {
      into = &by_tenant[std::string(tenant)];
      paths.remove_prefix(equals + 1);
    }
  }
  for (absl::string_view root : absl::StrSplit(paths, ',', absl::SkipEmpty())) into->emplace_back(root);
}

}  // namespace recal::jobs
