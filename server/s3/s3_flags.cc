#include "server/s3/s3_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, s3_endpoint, "",
          "object storage (s3:// data, --blobs=s3://): http(s)://HOST[:PORT] of an S3-compatible server "
          "(MinIO, Ceph RGW, ...); empty: AWS");
ABSL_FLAG(std::string, s3_region, "", "empty: $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1");
ABSL_FLAG(std::string, s3_addressing, "", "path | virtual; empty: path with --s3_endpoint, virtual for AWS");
ABSL_FLAG(std::string, s3_credentials_dir, "",
          "a directory with access_key_id, secret_access_key[, session_token]; empty: the AWS_* "
          "environment variables, then the shared credentials file");
ABSL_FLAG(std::string, s3_profile, "", "shared credentials profile; empty: $AWS_PROFILE, else default");

namespace recal::s3 {

S3Settings S3SettingsFromFlags() {
  return {.endpoint = absl::GetFlag(FLAGS_s3_endpoint),
          .region = absl::GetFlag(FLAGS_s3_region),
          .addressing = absl::GetFlag(FLAGS_s3_addressing),
          .credentials_dir = absl::GetFlag(FLAGS_s3_credentials_dir),
          .profile = absl::GetFlag(FLAGS_s3_profile)};
}

}  // namespace recal::s3
