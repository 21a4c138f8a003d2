#include "server/store/open_blob_store.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/store/local_blob_store.h"
#include "server/store/s3_blob_store.h"

namespace recal::store {

absl::StatusOr<OpenedBlobStore> OpenBlobStore(const BlobStoreSettings& settings) {
  const std::string& spec = settings.spec;
  OpenedBlobStore opened;
  if (absl::StartsWith(spec, "s3://")) {
    absl::StatusOr<s3::S3Location> location = s3::ParseS3Url(spec);
    if (!location.ok()) return absl::InvalidArgumentError(absl::StrCat("--blobs=", spec, ": ", location.status().message()));
    if (!settings.object_storage) return absl::InvalidArgumentError("--blobs=s3://... without object storage settings");
    absl::StatusOr<s3::S3ClientOptions> options = settings.object_storage();
    if (!options.ok()) return options.status();
    absl::StatusOr<std::unique_ptr<s3::S3Client>> client = s3::S3Client::Create(*std::move(options));
    if (!client.ok()) return client.status();
    S3BlobStoreOptions store_options;
    store_options.location = *std::move(location);
    store_options.local_dir = absl::StrCat(settings.data_dir, "/s3-blobs");
    store_options.part_bytes = settings.part_bytes;
    store_options.cache_bytes = settings.cache_bytes;
    absl::StatusOr<std::unique_ptr<S3BlobStore>> store = S3BlobStore::Open(*std::move(client), store_options);
    if (!store.ok()) return store.status();
    opened.reachable = (*store)->Probe();
    if (!opened.reachable.ok() && !absl::IsUnavailable(opened.reachable)) {
      return absl::Status(opened.reachable.code(),
                          absl::StrCat("--blobs=", spec, ": ", opened.reachable.message()));
    }
    opened.store = *std::move(store);
    return opened;
  }
  std::string dir = settings.data_dir;
  if (!spec.empty()) {
    absl::string_view rest = spec;
    if (!absl::ConsumePrefix(&rest, "file:") || rest.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--blobs=", spec, " is neither file:DIR nor s3://BUCKET/PREFIX"));
    }
    dir = std::string(rest);
  }
  absl::StatusOr<std::unique_ptr<LocalBlobStore>> store = LocalBlobStore::Open(dir);
  if (!store.ok()) return store.status();
  opened.local_blob_dir = (*store)->blob_dir();
  opened.store = *std::move(store);
  return opened;
}

}  // namespace recal::store
