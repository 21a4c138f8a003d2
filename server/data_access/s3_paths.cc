#include "server/data_access/s3_paths.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/s3/s3_config.h"

namespace recal::data {
namespace {

constexpr absl::string_view kScheme = "s3://";

absl::Status Refused(absl::string_view path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "s3 path '", absl::CHexEscape(path.substr(0, 200)), "': ", why,
      " (an s3:// path names a bucket and a key only; the endpoint and credentials are the server's "
      "configuration)"));
}

// Bucket and the text after "s3://BUCKET/", checked by stage 1's ParseS3Url (scheme,
// characters, bucket name, ".." segments); `normalized` is its prefix, which drops empty
// and "." segments: the caller compares it with the text to refuse those.
absl::Status Split(absl::string_view path, std::string* bucket, absl::string_view* rest, std::string* normalized) {
  if (!absl::StartsWith(path, kScheme)) return Refused(path, "must start with s3://");
  absl::StatusOr<s3::S3Location> loc = s3::ParseS3Url(path);
  if (!loc.ok()) return Refused(path, loc.status().message());
  absl::string_view after = path.substr(kScheme.size());
  const size_t slash = after.find('/');
  *rest = slash == absl::string_view::npos ? absl::string_view() : after.substr(slash + 1);
  *bucket = loc->bucket;
  *normalized = loc->prefix;
  return absl::OkStatus();
}

}  // namespace

bool IsS3Path(absl::string_view path) { return absl::StartsWith(path, kScheme); }

absl::StatusOr<S3Path> ParseS3ObjectPath(absl::string_view path) {
  S3Path out;
  absl::string_view rest;
  std::string normalized;
  if (absl::Status s = Split(path, &out.bucket, &rest, &normalized); !s.ok()) return s;
  if (rest.empty() || absl::EndsWith(rest, "/")) return Refused(path, "names no object (s3://BUCKET/KEY)");
  if (normalized != absl::StrCat(rest, "/")) return Refused(path, "the key has an empty or \".\" segment");
  if (absl::Status s = s3::ValidateObjectKey(rest); !s.ok()) return Refused(path, s.message());
  out.key = std::string(rest);
  return out;
}

absl::StatusOr<S3Path> ParseS3FolderPath(absl::string_view path) {
  S3Path out;
  absl::string_view rest;
  std::string normalized;
  if (absl::Status s = Split(path, &out.bucket, &rest, &normalized); !s.ok()) return s;
  if (normalized != rest && normalized != absl::StrCat(rest, "/")) {
    return Refused(path, "the prefix has an empty or \".\" segment");
  }
  out.key = std::move(normalized);
  return out;
}

absl::Status CheckS3UnderRoots(const std::vector<std::string>& roots, const S3Path& path) {
  std::vector<absl::string_view> s3_roots;
  for (const std::string& root : roots) {
    if (!IsS3Path(root)) continue;
    s3_roots.push_back(root);
    absl::StatusOr<s3::S3Location> loc = s3::ParseS3Url(root);
    if (!loc.ok()) continue;
    // loc->prefix is "" or ends in '/': a prefix match is a match on whole segments.
    if (loc->bucket == path.bucket && absl::StartsWith(path.key, loc->prefix)) return absl::OkStatus();
  }
  if (s3_roots.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat(path.ToString(), " refused: the server has no s3:// data roots (--data_root=s3://BUCKET/PREFIX)"));
  }
  return absl::PermissionDeniedError(absl::StrCat(path.ToString(), " is outside the server's s3:// data roots (",
                                                  absl::StrJoin(s3_roots, ", "), ")"));
}

}  // namespace recal::data
