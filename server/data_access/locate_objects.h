// What a data spec in a bucket (s3_paths.h) reads, found before any of it is read:
// npy:s3://BUCKET/KEY and safetensors:s3://BUCKET/KEY[:keys] name one object,
// images:s3://BUCKET/PREFIX/?... the image objects under a prefix (one listing, the same
// file selection as a local folder: image_files.h). The batch sources over those objects
// are server/data/s3_sources.h; the server's worker runner calls this alone, where the
// network and the credentials are, and hands the result to its sandboxed worker.
//
// Errors: INVALID_ARGUMENT for a malformed or hostile path, and for torch: (torch.save
// files are unpickled whole, never read by ranges); FAILED_PRECONDITION when no object
// storage is configured; PERMISSION_DENIED outside the s3:// data roots (when roots are
// given) or when S3 refuses; NOT_FOUND naming a missing bucket or key; UNAVAILABLE when
// the endpoint is down (after the client's bounded retries).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data_spec.h"
#include "server/data_access/object_storage.h"

namespace recal::data {

// Where a process may read data from, and how it reaches a bucket.
struct DataAccess {
  // Not empty (the server's data roots): image-folder files must resolve under one of these,
  // and s3:// specs must lie under one of its s3://BUCKET/PREFIX entries (s3_paths.h).
  // Empty: no confinement (recal-run, whose operator names the data).
  std::vector<std::string> data_roots;
  // Where s3:// specs are read (object_storage.h): the endpoint and credentials are the
  // server's (or recal-run's) own configuration, never the spec's. Null: s3:// specs fail
  // with FAILED_PRECONDITION.
  std::shared_ptr<ObjectStorage> object_storage;
};

// Whether the spec's path is in a bucket (false for a spec that does not parse).
bool ReadsObjectStorage(const DataSpec& spec);

// What a spec with ReadsObjectStorage reads: its tensor file's object (one HEAD), or its
// image folder's image objects (one listing, the folder's selection rules applied, in key
// order), after the path and the roots are checked (no request is made for a path that
// is refused). Keys that no local tree could hold (an empty, "." or ".." segment, as in
// "a//b.png") are left out, so a bucket and a local copy of it give the same batches.
// LocatedObjects: object_storage.h.
absl::StatusOr<LocatedObjects> LocateObjects(const DataSpec& spec, const DataAccess& access);

}  // namespace recal::data
