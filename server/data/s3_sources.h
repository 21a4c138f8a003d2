// Data specs whose path is in a bucket (s3_paths.h): npy:s3://BUCKET/KEY,
// safetensors:s3://BUCKET/KEY[:keys] and images:s3://BUCKET/PREFIX/?..., read through an
// ObjectStorage (object_storage.h): the bucket itself under the caller's configuration, or,
// in the server's sandboxed worker, the runner that holds that configuration for it.
//
//  - Tensor files: the same sources as local files over an object (ObjectFile):
//    one HEAD, the header in one or two ranged GETs, then one ranged GET per batch (per
//    key, for safetensors) of exactly the batch's rows; never the whole object.
//  - Image folders: one listing of the prefix (ListObjectsV2, all pages), the same file
//    selection and order as a local folder (image_source.h: IsImageFileName, byte-wise
//    sort of the relative paths, the seeded shuffle, samples), objects fetched whole by
//    the decoding threads, a bounded window ahead of Next(), and decoded by the same code.
//    Keys that no local tree could hold (an empty, "." or ".." segment, as in "a//b.png")
//    are left out, so a bucket and a local copy of it give the same batches.
//  - torch: is refused (INVALID_ARGUMENT): torch.save files are unpickled whole.
//
// Errors: INVALID_ARGUMENT for a malformed or hostile path; FAILED_PRECONDITION when no
// object storage is configured; PERMISSION_DENIED outside the s3:// data roots (when roots
// are given) or when S3 refuses; NOT_FOUND naming a missing bucket or key, or a prefix
// without images; UNAVAILABLE when the endpoint is down (after the client's bounded
// retries), also from a Next() mid-job.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data_spec.h"
#include "server/data/batch_source.h"
#include "server/data/object_storage.h"
#include "server/s3/s3_client.h"
#include "server/s3/s3_config.h"

namespace recal::data {

// Whether the spec's path is in a bucket (false for a spec that does not parse).
bool ReadsObjectStorage(const DataSpec& spec);

// What a spec with ReadsObjectStorage reads: its tensor file's object (one HEAD), or its
// image folder's image objects (one listing, the folder's selection rules applied, in key
// order), after the path and the roots are checked (no request is made for a path that
// is refused). A sandboxed worker is given exactly these (server/jobs/worker_runner.cc).
// LocatedObjects: object_storage.h.
absl::StatusOr<LocatedObjects> LocateObjects(const DataSpec& spec, const InputOptions& options);

// The source for a spec with ReadsObjectStorage (before normalisation and prefetching,
// which OpenBatchSource adds as for local files).
absl::StatusOr<std::unique_ptr<BatchSource>> OpenS3Source(const DataSpec& spec, int64_t batch_size,
                                                          const InputOptions& options);

// The s3::S3ClientOptions of a process from its flags (s3::S3Settings: endpoint,
// region, addressing, credentials dir, profile) and the environment (AWS_* variables, the
// shared credentials file), with the client's default retries and timeouts (ConnectBucket
// makes InputOptions::object_storage of them). For recal-run and the server's wiring;
// errors as s3::MakeS3Config's.
absl::StatusOr<s3::S3ClientOptions> ObjectStorageOptions(const s3::S3Settings& settings,
                                                        const s3::EnvLookup& env = s3::ProcessEnv());

}  // namespace recal::data
