// One moto_server for every test of a process (about 2 s to start), with authentication on
// (every request's signature is checked by botocore's code), and a fresh bucket per caller.
// Where moto_server is not installed, tests skip, saying so.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "server/s3/s3_client.h"
#include "tests/s3/moto_server.h"

namespace recal::store::testing {

struct SharedMoto {
  s3::testing::MotoServer* server;
  s3::Credentials credentials;  // the IAM user's key (s3:*)
};

// Started at the first call, stopped at exit. NOT_FOUND when moto_server is not on PATH (skip);
// another error when it did not come up (fail).
absl::StatusOr<const SharedMoto*> Moto();

// A new bucket no other caller of the process uses.
absl::StatusOr<std::string> NewBucket(s3::S3Client& client);

}  // namespace recal::store::testing
