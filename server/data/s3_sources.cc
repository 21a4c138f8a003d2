#include "server/data/s3_sources.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/data/image_source.h"
#include "server/data/s3_object_file.h"
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

absl::StatusOr<std::unique_ptr<BatchSource>> OpenS3Images(const DataSpec& spec, const S3Path& folder,
                                                          std::shared_ptr<s3::S3Client> client,
                                                          int64_t batch_size, const InputOptions& options) {
  const std::string label = DataSpecToString(spec);
  absl::StatusOr<std::vector<s3::ObjectInfo>> listed = client->ListObjects(folder.bucket, folder.key);
  if (!listed.ok()) return Prefixed(label, listed.status());
  std::vector<std::string> files;
  for (const s3::ObjectInfo& object : *listed) {
    const std::string relative = object.key.substr(folder.key.size());
    if (IsPlainRelativePath(relative) && IsImageFileName(relative)) files.push_back(relative);
  }
  ImageFileReader read = [client, folder](const std::string& relative) -> absl::StatusOr<std::string> {
    std::string bytes;
    absl::Status got = client->GetObject(folder.bucket, folder.key + relative, [&bytes](absl::string_view piece) {
      bytes.append(piece.data(), piece.size());
      return absl::OkStatus();
    });
    if (!got.ok()) return got;
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

absl::StatusOr<std::unique_ptr<BatchSource>> OpenS3Source(const DataSpec& spec, int64_t batch_size,
                                                          const InputOptions& options) {
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
  absl::StatusOr<std::unique_ptr<s3::S3Client>> created = s3::S3Client::Create(*options.object_storage);
  if (!created.ok()) return Prefixed(label, created.status());
  std::shared_ptr<s3::S3Client> client = *std::move(created);
  if (folder) return OpenS3Images(spec, *path, std::move(client), batch_size, options);

  absl::StatusOr<std::shared_ptr<const RandomAccessFile>> file = OpenS3Object(client, path->bucket, path->key);
  if (!file.ok()) return Prefixed(label, file.status());
  if (spec.scheme == DataSpec::Scheme::kNpy) return OpenNpySource(*std::move(file), batch_size);
  return OpenSafetensorsSource(*std::move(file), spec.keys, batch_size);
}

absl::StatusOr<s3::S3ClientOptions> ObjectStorageOptions(const s3::S3Settings& settings, const s3::EnvLookup& env) {
  absl::StatusOr<s3::S3Config> config = s3::MakeS3Config(settings, env);
  if (!config.ok()) return config.status();
  s3::S3ClientOptions options;
  options.config = *std::move(config);
  return options;
}

}  // namespace recal::data
