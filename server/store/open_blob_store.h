// --blobs, read: file:DIR (the default, DATA_DIR) or s3://BUCKET/PREFIX.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/s3/s3_client.h"
#include "server/store/blob_store.h"

namespace recal::store {

struct BlobStoreSettings {
  std::string spec;      // --blobs; empty: file:DATA_DIR
  std::string data_dir;  // --data_dir: the default blob directory; for s3://, DATA_DIR/s3-blobs
                         // holds what stays on this host (staged uploads, scratch, the cache)
  // The server's object-storage configuration (its --s3_* flags and the environment). Called
  // only for s3://, so that credentials are looked up only where a bucket is used.
  std::function<absl::StatusOr<s3::S3ClientOptions>()> object_storage;
  int64_t part_bytes = int64_t{64} << 20;  // multipart part size for s3://
  int64_t cache_bytes = 0;                 // s3://: the bound on the models cached on this host
};

struct OpenedBlobStore {
  std::unique_ptr<BlobStore> store;
  // file: the directory the blobs are in; empty for s3://.
  std::string local_blob_dir;
  // s3://: the first listing's answer. UNAVAILABLE is given back here rather than failing the
  // start (the endpoint may come up later; until then jobs fail with it); a missing bucket or
  // refused credentials fail the open instead.
  absl::Status reachable;
};

absl::StatusOr<OpenedBlobStore> OpenBlobStore(const BlobStoreSettings& settings);

}  // namespace recal::store
