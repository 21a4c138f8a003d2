// Where s3:// data specs are read (locate_objects.h, server/data/s3_sources.h): what the
// sources need of a bucket, three calls, behind one interface so that the same sources run
// wherever the network is.
//
//  - ConnectBucket: this process talks to the endpoint itself with its own configuration
//    (recal-run; the server's trusted worker runner).
//  - A sandboxed recal-worker has no network and no credentials: its ObjectStorage
//    (server/worker/remote_objects.h) asks the runner that started it for byte ranges of the
//    objects the runner found for the job, over the pipes they share; the runner answers
//    with a ConnectBucket storage (server/jobs/remote_reads.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/data_access/random_access_file.h"
#include "server/s3/s3_client.h"
#include "server/s3/s3_config.h"

namespace recal::data {

class ObjectStorage {
 public:
  virtual ~ObjectStorage() = default;

  // The object's size and version (a HEAD). NOT_FOUND naming the bucket or the key.
  virtual absl::StatusOr<s3::ObjectInfo> Stat(const std::string& bucket, const std::string& key) = 0;
  // Every object whose key starts with `prefix`, in key order.
  virtual absl::StatusOr<std::vector<s3::ObjectInfo>> List(const std::string& bucket, const std::string& prefix) = 0;
  // Exactly out.size() bytes of `object` from offset, of the version Stat or List saw
  // (FAILED_PRECONDITION once it was replaced). Thread-safe.
  virtual absl::Status Read(const std::string& bucket, const s3::ObjectInfo& object, int64_t offset,
                            absl::Span<char> out) = 0;
};

// What a data spec in a bucket reads (locate_objects.h, LocateObjects): a tensor file's one
// object, or an image folder's image objects, in key order.
struct LocatedObjects {
  std::string bucket;
  std::vector<s3::ObjectInfo> objects;
};

// The s3::S3ClientOptions of a process from its flags (s3::S3Settings: endpoint,
// region, addressing, credentials dir, profile) and the environment (AWS_* variables, the
// shared credentials file), with the client's default retries and timeouts (ConnectBucket
// makes DataAccess::object_storage of them, locate_objects.h). For recal-run and the
// server's wiring; errors as s3::MakeS3Config's.
absl::StatusOr<s3::S3ClientOptions> ObjectStorageOptions(const s3::S3Settings& settings,
                                                        const s3::EnvLookup& env = s3::ProcessEnv());

// The bucket's endpoint under `options` (recal-run's or the server's own configuration).
absl::StatusOr<std::shared_ptr<ObjectStorage>> ConnectBucket(const s3::S3ClientOptions& options);

// An object as a file read by ranges (random_access_file.h), never whole; named
// s3://BUCKET/KEY in messages.
std::shared_ptr<const RandomAccessFile> ObjectFile(std::shared_ptr<ObjectStorage> storage, std::string bucket,
                                                   s3::ObjectInfo object);

}  // namespace recal::data
