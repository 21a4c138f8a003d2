#include "server/data/s3_sources.h"

#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/data/image_source.h"
#include "server/data/object_storage.h"
#include "server/data/s3_paths.h"
#include "server/data/sources.h"

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
absl::StatusOr<S3Path> CheckedPath(const DataSpec& spec, const InputOptions& options) {
  const std::string label = DataSpecToString(spec);
  if (spec.scheme == DataSpec::Scheme::kTorch) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": torch files are read from local paths only (they are unpickled whole); use npy or safetensors "
               "in a bucket"));
  }
  const bool folder = spec.scheme == DataSpec::Scheme::kImages;
  absl::StatusOr<S3Path> path = folder ? ParseS3FolderPath(spec.path) : ParseS3ObjectPath(spec.path);
  if (!path.ok()) return Prefixed(label, path.status());
  if (!options.object_storage) {
    return absl::FailedPreconditionError(absl::StrCat(
        label, ": this server has no object storage configured, so s3:// data cannot be read (see --s3_endpoint)"));
  }
  if (!options.data_roots.empty()) {
    if (absl::Status inside = CheckS3UnderRoots(options.data_roots, *path); !inside.ok()) {
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

// The folder's images, read whole by the decoding threads.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenS3Images(const DataSpec& spec, LocatedObjects located,
                                                          std::shared_ptr<ObjectStorage> storage,
                                                          int64_t batch_size, const InputOptions& options) {
  const S3Path folder = *ParseS3FolderPath(spec.path);  // LocateObjects parsed it
  std::vector<std::string> files;
  auto by_name = std::make_shared<std::unordered_map<std::string, s3::ObjectInfo>>();
  for (s3::ObjectInfo& object : located.objects) {
    std::string relative = object.key.substr(folder.key.size());
    files.push_back(relative);
    by_name->emplace(std::move(relative), std::move(object));
  }
  ImageFileReader read = [storage, folder, by_name](const std::string& relative) -> absl::StatusOr<std::string> {
    auto found = by_name->find(relative);
    if (found == by_name->end()) return absl::NotFoundError(absl::StrCat(folder.ToString(), relative, " was not listed"));
    std::string bytes(static_cast<size_t>(found->second.size), '\0');
    if (absl::Status read = storage->Read(folder.bucket, found->second, 0, absl::MakeSpan(bytes)); !read.ok()) {
      return read;
    }
    return bytes;
  };
  // The roots were checked for the prefix; keys under it are under them too (no links).
  return MakeImageSource(spec, std::move(files), std::move(read), folder.ToString(), batch_size,
                         {.threads = options.decode_threads});
}

}  // namespace

bool ReadsObjectStorage(const DataSpec& spec) {
  return spec.scheme != DataSpec::Scheme::kSynthetic && IsS3Path(spec.path);
}

absl::StatusOr<LocatedObjects> LocateObjects(const DataSpec& spec, const InputOptions& options) {
  absl::StatusOr<S3Path> path = CheckedPath(spec, options);
  if (!path.ok()) return path.status();
  LocatedObjects located{path->bucket, {}};
  if (spec.scheme == DataSpec::Scheme::kImages) {
    absl::StatusOr<std::vector<s3::ObjectInfo>> images = ImageObjects(*options.object_storage, *path);
    if (!images.ok()) return Prefixed(DataSpecToString(spec), images.status());
    located.objects = *std::move(images);
  } else {
    absl::StatusOr<s3::ObjectInfo> object = options.object_storage->Stat(path->bucket, path->key);
    if (!object.ok()) return Prefixed(DataSpecToString(spec), object.status());
    located.objects.push_back(*std::move(object));
  }
  return located;
}

absl::StatusOr<std::unique_ptr<BatchSource>> OpenS3Source(const DataSpec& spec, int64_t batch_size,
                                                          const InputOptions& options) {
  absl::StatusOr<LocatedObjects> located = LocateObjects(spec, options);
  if (!located.ok()) return located.status();
  if (spec.scheme == DataSpec::Scheme::kImages) {
    return OpenS3Images(spec, *std::move(located), options.object_storage, batch_size, options);
  }
  if (located->objects.size() != 1) return absl::InternalError(absl::StrCat(DataSpecToString(spec), ": not one object"));
  std::shared_ptr<const RandomAccessFile> file =
      ObjectFile(options.object_storage, located->bucket, std::move(located->objects[0]));
  if (spec.scheme == DataSpec::Scheme::kNpy) return OpenNpySource(std::move(file), batch_size);
  return OpenSafetensorsSource(std::move(file), spec.keys, batch_size);
}

absl::StatusOr<s3::S3ClientOptions> ObjectStorageOptions(const s3::S3Settings& settings, const s3::EnvLookup& env) {
  absl::StatusOr<s3::S3Config> config = s3::MakeS3Config(settings, env);
  if (!config.ok()) return config.status();
  s3::S3ClientOptions options;
  options.config = *std::move(config);
  return options;
}

}  // namespace recal::data
