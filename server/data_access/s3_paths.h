// The s3:// paths of data specs (npy:s3://BUCKET/KEY, safetensors:s3://BUCKET/KEY[:keys],
// images:s3://BUCKET/PREFIX/?...) and the s3:// data roots that confine them.
//
// A spec names a bucket and a key, nothing more: the endpoint and the credentials are the
// server's (or recal-run's) configuration, so a job cannot make the server call an address
// of its choosing (no SSRF). What would name anything else is refused, not reinterpreted:
// user info, a host or port ('@' and ':' are not bucket characters, and an IP address is
// not a bucket), a query or fragment, a backslash, control characters, and key segments
// that are empty, "." or ".." (an object key is taken literally, so "a//b" or "a/./b"
// would name another object than the path it looks like).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal::data {

// The path starts with "s3://" (a local path never does: a relative "s3:" directory would
// have to be spelled "./s3:/...").
bool IsS3Path(absl::string_view path);

struct S3Path {
  std::string bucket;
  // An object's key ("a/b.npy"), or a folder's prefix: "" (the whole bucket) or ending in
  // '/' ("a/b/").
  std::string key;
  std::string ToString() const { return "s3://" + bucket + "/" + key; }
};

// s3://BUCKET/KEY: INVALID_ARGUMENT saying why for anything else (see above).
absl::StatusOr<S3Path> ParseS3ObjectPath(absl::string_view path);
// s3://BUCKET[/PREFIX[/]]: the prefix, ending in '/' unless empty.
absl::StatusOr<S3Path> ParseS3FolderPath(absl::string_view path);

// OK if `path` (an object or a folder prefix) lies under one of the s3://BUCKET/PREFIX
// roots in `roots` (local roots are ignored): the same bucket, and the key starts with the
// root's prefix on a whole segment ("s3://b/data" admits b/data/x, not b/database/x).
// PERMISSION_DENIED naming the path and the roots otherwise. Malformed roots admit nothing.
absl::Status CheckS3UnderRoots(const std::vector<std::string>& roots, const S3Path& path);

}  // namespace recal::data
