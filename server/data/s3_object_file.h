// An object in a bucket as a RandomAccessFile (random_access_file.h): read by ranged GETs,
// never whole. The size and ETag are taken once, at open (HEAD); every read asks for that
// ETag (If-Match), so an object replaced while a job reads it fails the read
// (FAILED_PRECONDITION) instead of mixing two versions' bytes in one job.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/data/random_access_file.h"
#include "server/s3/s3_client.h"

namespace recal::data {

// NOT_FOUND naming the bucket or s3://bucket/key, PERMISSION_DENIED, UNAVAILABLE (the
// endpoint down, after the client's bounded retries): the client's statuses.
absl::StatusOr<std::shared_ptr<const RandomAccessFile>> OpenS3Object(std::shared_ptr<s3::S3Client> client,
                                                                     const std::string& bucket,
                                                                     const std::string& key);

}  // namespace recal::data
