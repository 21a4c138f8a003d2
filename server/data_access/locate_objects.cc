#include "server/data_access/locate_objects.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/data_access/image_files.h"
#include "server/data_access/s3_paths.h"

namespace recal::data {
namespace {

absl::Status Prefixed(const std::string& label, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(label, ": ", status.message()));
}

// A listed key's path under the folder, as a local tree could hold it: segments that are
// not empty, "." or "..".
bool IsPlainRelativePath(absl::string_view relative) {
  for (absl::string_view segment : absl::StrSplit(relative, '/')) {
    if (segment.empty() || segment == "." || segment == "..") return false;
  }
  return true;
}

// The spec's path, checked (syntax, configuration, roots) before anything is asked of the
// endpoint.
absl::StatusOr<S3Path> CheckedPath(const DataSpec& spec, const DataAccess& access) {
  const std::string label = DataSpecToString(spec);
  if (spec.scheme == DataSpec::Scheme::kTorch) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": torch files are read from local paths only (they are unpickled whole); use npy or safetensors "
               "in a bucket"));
  }
  const bool folder = spec.scheme == DataSpec::Scheme::kImages;
  absl::StatusOr<S3Path> path = folder ? ParseS3FolderPath(spec.path) : ParseS3ObjectPath(spec.path);
  if (!path.ok()) return Prefixed(label, path.status());
  if (!access.object_storage) {
    return absl::FailedPreconditionError(absl::StrCat(
        label, ": this server has no object storage configured, so s3:// data cannot be read (see --s3_endpoint)"));
  }
  if (!access.data_roots.empty()) {
    if (absl::Status inside = CheckS3UnderRoots(access.data_roots, *path); !inside.ok()) {
      return Prefixed(label, inside);
    }
  }
  return path;
}

absl::StatusOr<std::vector<s3::ObjectInfo>> ImageObjects(ObjectStorage& storage, const S3Path& folder) {
  absl::StatusOr<std::vector<s3::ObjectInfo>> listed = storage.List(folder.bucket, folder.key);
  if (!listed.ok()) return listed.status();
  std::vector<s3::ObjectInfo> images;
  for (s3::ObjectInfo& object : *listed) {
    if (object.key.compare(0, folder.key.size(), folder.key) != 0) continue;
    const std::string relative = object.key.substr(folder.key.size());
    if (IsPlainRelativePath(relative) && IsImageFileName(relative)) images.push_back(std::move(object));
  }
  return images;
}

}  // namespace

bool ReadsObjectStorage(const DataSpec& spec) {
  return spec.scheme != DataSpec::Scheme::kSynthetic && IsS3Path(spec.path);
}

absl::StatusOr<LocatedObjects> LocateObjects(const DataSpec& spec, const DataAccess& access) {
  absl::StatusOr<S3Path> path = CheckedPath(spec, access);
  if (!path.ok()) return path.status();
  LocatedObjects located{path->bucket, {}};
  if (spec.scheme == DataSpec::Scheme::kImages) {
    absl::StatusOr<std::vector<s3::ObjectInfo>> images = ImageObjects(*access.object_storage, *path);
    if (!images.ok()) return Prefixed(DataSpecToString(spec), images.status());
    located.objects = *std::move(images);
  } else {
    absl::StatusOr<s3::ObjectInfo> object = access.object_storage->Stat(path->bucket, path->key);
    if (!object.ok()) return Prefixed(DataSpecToString(spec), object.status());
    located.objects.push_back(*std::move(object));
  }
  return located;
}

}  // namespace recal::data
