// Where the S3 client connects and as whom: the endpoint, region and addressing style,
// credentials from the places AWS tools look, and s3://BUCKET/PREFIX locations.
// Everything here is the server's configuration, never a client's: a job names a location
// under a configured bucket, it cannot name an endpoint (no SSRF).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/s3/sigv4.h"

namespace recal::s3 {

enum class Addressing {
  kPath,         // http://endpoint/BUCKET/KEY: MinIO, Ceph RGW, SeaweedFS, moto
  kVirtualHost,  // https://BUCKET.endpoint/KEY: AWS's preferred form
};

struct Endpoint {
  std::string scheme;  // "http" or "https"
  std::string host;    // "127.0.0.1", "s3.us-east-1.amazonaws.com", "[::1]"
  int port = 0;        // 0: the scheme's default
  // "scheme://host[:port]" as configured, for messages ("endpoint ... unreachable").
  std::string ToString() const;
  // The Host header: host, plus ":port" when not the scheme's default.
  std::string HostHeader() const;
};

// "http://127.0.0.1:9000", "https://minio.example:9000/" (a trailing '/' is allowed; any
// other path, a query, user info or another scheme is INVALID_ARGUMENT).
absl::StatusOr<Endpoint> ParseEndpoint(absl::string_view url);

struct S3Config {
  Endpoint endpoint;
  std::string region = "us-east-1";
  Addressing addressing = Addressing::kPath;
  Credentials credentials;
};

// What the server's flags say; empty means "not given".
struct S3Settings {
  std::string endpoint;         // empty: AWS, https://s3.REGION.amazonaws.com
  std::string region;           // empty: $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1
  std::string addressing;       // "path", "virtual", or empty: path-style when an endpoint is
                                // given (what S3-compatible servers expect), virtual-host for AWS
  std::string credentials_dir;  // a mounted secret (see LoadCredentials)
  std::string profile;          // empty: $AWS_PROFILE, else "default"
};

// Reads an environment variable; nullopt when unset. Injected so that tests need not
// change the process's environment.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
EnvLookup ProcessEnv();

// Credentials, first match wins:
//  1. settings.credentials_dir, when given: files access_key_id, secret_access_key and
//     optionally session_token (a Kubernetes Secret volume); it is an explicit choice, so
//     a missing file is an error, not a fall-through;
//  2. $AWS_ACCESS_KEY_ID + $AWS_SECRET_ACCESS_KEY (+ $AWS_SESSION_TOKEN); one without
//     the other is an error;
//  3. the shared credentials file $AWS_SHARED_CREDENTIALS_FILE, else $HOME/.aws/credentials,
//     profile settings.profile, else $AWS_PROFILE, else "default" (aws_access_key_id,
//     aws_secret_access_key, aws_session_token). A named profile that is missing is an error.
// None of them: FAILED_PRECONDITION saying where it looked. Values are trimmed of
// surrounding whitespace (a secret file usually ends with a newline).
absl::StatusOr<Credentials> LoadCredentials(const S3Settings& settings, const EnvLookup& env);

// Endpoint, region, addressing and credentials from the settings and the environment.
absl::StatusOr<S3Config> MakeS3Config(const S3Settings& settings, const EnvLookup& env);

// The sections of an INI file (the AWS shared credentials file): "[name]" headers,
// "key = value" lines, '#' and ';' comments. Returns the key/values of `section`, or
// NOT_FOUND. Files over 1 MiB are refused.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ReadIniSection(absl::string_view text,
                                                                                absl::string_view section);

// s3://BUCKET[/PREFIX]
struct S3Location {
  std::string bucket;
  // "" or "a/b/": no leading '/', empty and "." segments dropped, always ending with '/'
  // so that prefix + name is a key under it.
  std::string prefix;
  std::string ToString() const;  // "s3://bucket/a/b/"
};

// INVALID_ARGUMENT for another scheme, an empty or invalid bucket name, a ".." segment,
// a '?' or '#' (a URL's query or fragment: never part of a location), control characters,
// or a prefix over 900 bytes (S3 keys are at most 1024).
absl::StatusOr<S3Location> ParseS3Url(absl::string_view url);

// S3's bucket naming rules: 3-63 characters of a-z 0-9 . -, starting and ending with a
// letter or digit, no "..", not an IPv4 address, not xn-- / sthree- prefixed, not ending
// in -s3alias or --ol-s3.
absl::Status ValidateBucketName(absl::string_view bucket);

// An object key: 1-1024 bytes, no NUL, CR or LF.
absl::Status ValidateObjectKey(absl::string_view key);

}  // namespace recal::s3
