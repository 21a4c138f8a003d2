// One moto_server for every test of a process (about 2 s to start), with authentication on
// (every request's signature is checked by botocore's code), and a fresh bucket per caller.
// Where moto_server is not installed, tests skip, saying so.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

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

// A test on the shared moto with a client of its IAM user and a bucket of its own; skipped,
// saying so, where moto_server is not installed. A subclass's SetUp calls this one first and
// returns if IsSkipped() or HasFatalFailure().
class SharedMotoTest : public ::testing::Test {
 protected:
  void SetUp() override;
  std::string endpoint() const { return moto_->server->endpoint(); }

  const SharedMoto* moto_ = nullptr;
  std::unique_ptr<s3::S3Client> client_;
  std::string bucket_;
};

// recal-server's flags for the endpoint, its credentials in a mounted-secret directory
// written at `secret_dir`: --s3_endpoint, --s3_credentials_dir.
std::vector<std::string> ServerS3Flags(const std::string& endpoint, const s3::Credentials& credentials,
                                       const std::string& secret_dir);

}  // namespace recal::store::testing
