#include "tests/store/shared_moto.h"

#include <sys/stat.h>

#include <atomic>
#include <memory>

#include "absl/strings/str_cat.h"
#include "tests/test_util.h"

namespace recal::store::testing {

absl::StatusOr<const SharedMoto*> Moto() {
  // Statics: the server (and its log directory) go at exit, the moto process with them.
  static const absl::StatusOr<SharedMoto>* started = [] {
    const std::string binary = s3::testing::FindOnPath("moto_server");
    if (binary.empty()) {
      return new absl::StatusOr<SharedMoto>(absl::NotFoundError("moto_server not installed: S3 blob store tests skipped"));
    }
    static recal::testing::TempDir* logs = new recal::testing::TempDir;
    static std::unique_ptr<s3::testing::MotoServer> server =
        s3::testing::MotoServer::Start(binary, logs->File("moto.log"));
    if (server == nullptr) {
      return new absl::StatusOr<SharedMoto>(
          absl::InternalError(absl::StrCat("moto_server did not start; see ", logs->File("moto.log"))));
    }
    absl::StatusOr<s3::Credentials> credentials = s3::testing::EnableAuth(server->endpoint());
    if (!credentials.ok()) return new absl::StatusOr<SharedMoto>(credentials.status());
    return new absl::StatusOr<SharedMoto>(SharedMoto{server.get(), *std::move(credentials)});
  }();
  if (!started->ok()) return started->status();
  return &**started;
}

absl::StatusOr<std::string> NewBucket(s3::S3Client& client) {
  static std::atomic<int> next{0};
  std::string bucket = absl::StrCat("recal-blobs-", next++);
  if (absl::Status made = client.CreateBucket(bucket); !made.ok()) return made;
  return bucket;
}

void SharedMotoTest::SetUp() {
  absl::StatusOr<const SharedMoto*> moto = Moto();
  if (absl::IsNotFound(moto.status())) GTEST_SKIP() << moto.status().message();
  ASSERT_TRUE(moto.ok()) << moto.status();
  moto_ = *moto;
  auto client = s3::S3Client::Create(s3::testing::FastClientOptions(endpoint(), moto_->credentials));
  ASSERT_TRUE(client.ok()) << client.status();
  client_ = *std::move(client);
  absl::StatusOr<std::string> bucket = NewBucket(*client_);
  ASSERT_TRUE(bucket.ok()) << bucket.status();
  bucket_ = *bucket;
}

std::vector<std::string> ServerS3Flags(const std::string& endpoint, const s3::Credentials& credentials,
                                       const std::string& secret_dir) {
  ::mkdir(secret_dir.c_str(), 0700);
  recal::testing::WriteBytes(secret_dir + "/access_key_id", credentials.access_key_id + "\n");
  recal::testing::WriteBytes(secret_dir + "/secret_access_key", credentials.secret_access_key + "\n");
  return {"--s3_endpoint=" + endpoint, "--s3_credentials_dir=" + secret_dir};
}

}  // namespace recal::store::testing
