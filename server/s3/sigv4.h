// AWS Signature Version 4 for S3 (and, with add_content_sha256_header = false, any AWS
// service): a pure function of the request and the credentials, so that it is checked
// against AWS's published vectors without a network (tests/s3/sigv4_test.cc).
//
// Written here rather than taken from a library because Debian 12's only S3 library,
// libs3 2.0, signs with the retired Signature Version 2 (HMAC-SHA1), which AWS regions
// opened since 2014 and MinIO's strict mode refuse.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace recal::s3 {

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // empty: long-term keys; else sent as x-amz-security-token
};

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// The part of an HTTP request that SigV4 signs.
struct SigningRequest {
  std::string method;  // "GET", "PUT", ...
  // Not encoded: "/bucket/key with space". S3 does not normalise paths: each segment is
  // percent-encoded once, '/' kept, "a//b" and "./" stay as they are.
  std::string path = "/";
  // Not encoded; the order does not matter (the canonical form sorts them). A parameter
  // without a value ("?uploads") has an empty value.
  HeaderList query;
  // Must contain Host. Names in any case; repeated names are joined with ',' in order.
  // The signer adds x-amz-date, x-amz-content-sha256, x-amz-security-token and
  // Authorization itself, so passing any of those is an error.
  HeaderList headers;
  // Lowercase hex SHA-256 of the body, or "UNSIGNED-PAYLOAD" (a streamed body whose hash
  // is not known before it is sent).
  std::string payload_hash;
  // S3 requires x-amz-content-sha256 on every request; other services do not send it.
  bool add_content_sha256_header = true;
};

struct SigningParams {
  Credentials credentials;
  std::string region;   // "us-east-1"
  std::string service;  // "s3"
  absl::Time time;      // becomes x-amz-date; servers refuse a clock off by > 15 minutes
};

struct SignedRequest {
  // To add to the request as they are: x-amz-date, [x-amz-content-sha256],
  // [x-amz-security-token], Authorization.
  HeaderList headers_to_add;
  // What the URL must carry so that the server canonicalises exactly what was signed.
  std::string encoded_path;   // "/bucket/key%20with%20space"
  std::string encoded_query;  // "max-keys=2&prefix=J" (sorted), "" if none
  // Intermediate values, for tests and for debugging a SignatureDoesNotMatch.
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;      // 64 hex characters
  std::string authorization;  // the Authorization header's value
};

inline constexpr absl::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";

// INVALID_ARGUMENT for what would make a malformed or ambiguous request: no Host header,
// a header name that is not an HTTP token, a CR, LF or NUL in a header value (header
// injection), a payload hash that is neither hex SHA-256 nor UNSIGNED-PAYLOAD, missing
// credentials, or a region/service containing '/'.
absl::StatusOr<SignedRequest> SignV4(const SigningRequest& request, const SigningParams& params);

// RFC 3986 percent-encoding as SigV4 wants it: every byte except A-Z a-z 0-9 - _ . ~ (and
// '/' when keep_slash) becomes %XX with uppercase hex.
std::string UriEncode(absl::string_view in, bool keep_slash);

// "20150830T123600Z", UTC.
std::string AmzDate(absl::Time t);

// Raw 32-byte HMAC-SHA256 (OpenSSL libcrypto).
std::string HmacSha256(absl::string_view key, absl::string_view data);

}  // namespace recal::s3
