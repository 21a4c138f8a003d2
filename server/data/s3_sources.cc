#include "server/data/s3_sources.h"

#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/data/image_source.h"
#include "server/data/sources.h"
#include "server/data_access/locate_objects.h"
#include "server/data_access/object_storage.h"
#include "server/data_access/s3_paths.h"

namespace recal::data {
namespace {

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

absl::StatusOr<std::unique_ptr<BatchSource>> OpenS3Source(const DataSpec& spec, int64_t batch_size,
                                                          const InputOptions& options) {
  absl::StatusOr<LocatedObjects> located = LocateObjects(spec, options.access);
  if (!located.ok()) return located.status();
  if (spec.scheme == DataSpec::Scheme::kImages) {
    return OpenS3Images(spec, *std::move(located), options.access.object_storage, batch_size, options);
  }
  if (located->objects.size() != 1) return absl::InternalError(absl::StrCat(DataSpecToString(spec), ": not one object"));
  std::shared_ptr<const RandomAccessFile> file =
      ObjectFile(options.access.object_storage, located->bucket, std::move(located->objects[0]));
  if (spec.scheme == DataSpec::Scheme::kNpy) return OpenNpySource(std::move(file), batch_size);
  return OpenSafetensorsSource(std::move(file), spec.keys, batch_size);
}

}  // namespace recal::data
