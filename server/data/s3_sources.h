// The batch sources of data specs whose path is in a bucket (server/data_access/s3_paths.h):
// npy:s3://BUCKET/KEY, safetensors:s3://BUCKET/KEY[:keys] and images:s3://BUCKET/PREFIX/?...,
// over the objects LocateObjects (server/data_access/locate_objects.h) finds, read through
// an ObjectStorage (server/data_access/object_storage.h): the bucket itself under the
// caller's configuration, or, in the server's sandboxed worker, the runner that holds that
// configuration for it.
//
//  - Tensor files: the same sources as local files over an object (ObjectFile):
//    one HEAD, the header in one or two ranged GETs, then one ranged GET per batch (per
//    key, for safetensors) of exactly the batch's rows; never the whole object.
//  - Image folders: one listing of the prefix (ListObjectsV2, all pages), the same file
//    selection and order as a local folder (server/data_access/image_files.h), objects
//    fetched whole by the decoding threads, a bounded window ahead of Next(), and decoded
//    by the same code as local files (image_source.h).
//  - torch: is refused (INVALID_ARGUMENT): torch.save files are unpickled whole.
//
// Errors: those of LocateObjects; NOT_FOUND naming a prefix without images; UNAVAILABLE
// when the endpoint is down (after the client's bounded retries), also from a Next() mid-job.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/data_spec.h"
#include "server/data/batch_source.h"

namespace recal::data {

// The source for a spec with ReadsObjectStorage (locate_objects.h), before normalisation
// and prefetching, which OpenBatchSource adds as for local files.
absl::StatusOr<std::unique_ptr<BatchSource>> OpenS3Source(const DataSpec& spec, int64_t batch_size,
                                                          const InputOptions& options);

}  // namespace recal::data
