#include "tests/store/shared_moto.h"

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

}  // namespace recal::store::testing
