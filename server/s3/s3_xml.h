// The XML bodies S3 answers with, parsed by expat into plain structs. Pure functions of the
// bytes (no network, no globals) so that they are fuzzed (fuzz/s3_xml_fuzzer.cc): an
// endpoint is configuration, but what it sends back is still untrusted input.
//
// Bounded: a body over kMaxXmlBytes, nested deeper than 32 or with more than 200,000
// elements is refused, and so is any DOCTYPE (no entity expansion of any kind).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal::s3 {

// A ListObjectsV2 page of 1000 keys of 1 KiB each is about 1.5 MB.
inline constexpr size_t kMaxXmlBytes = 16 << 20;

struct ObjectInfo {
  std::string key;
  int64_t size = 0;
  std::string etag;  // without the quotes

  bool operator==(const ObjectInfo& o) const { return key == o.key && size == o.size && etag == o.etag; }
};

// <ListBucketResult> of ListObjectsV2.
struct ListPage {
  std::vector<ObjectInfo> objects;
  std::vector<std::string> common_prefixes;
  bool is_truncated = false;
  std::string next_continuation_token;
};

// <Error>: what S3 says went wrong. Every field may be empty.
struct ErrorBody {
  std::string code;     // "NoSuchKey", "SlowDown", ...
  std::string message;
  std::string bucket_name;
  std::string key;
  std::string request_id;
};

// <CompleteMultipartUploadResult>, or an <Error> inside a 200 response: S3 may answer
// CompleteMultipartUpload with 200 and report a failure only in the body.
struct CompleteResult {
  bool is_error = false;
  ErrorBody error;  // when is_error
  std::string etag;
  std::string location;
};

// Each returns INVALID_ARGUMENT (naming the problem) for malformed XML, a different root
// element, a missing required field (a Key without Size, an upload without UploadId) or a
// number that does not parse; never crashes or allocates beyond the bounds above.
absl::StatusOr<ListPage> ParseListBucketResult(absl::string_view xml);
absl::StatusOr<std::string> ParseInitiateMultipartUploadResult(absl::string_view xml);  // the UploadId
absl::StatusOr<ErrorBody> ParseErrorBody(absl::string_view xml);
absl::StatusOr<CompleteResult> ParseCompleteMultipartUploadResult(absl::string_view xml);

// Text escaped for an XML element (&, <, >, ", ').
std::string XmlEscape(absl::string_view text);

// An S3 ETag without its surrounding double quotes.
std::string StripEtagQuotes(absl::string_view etag);

}  // namespace recal::s3
