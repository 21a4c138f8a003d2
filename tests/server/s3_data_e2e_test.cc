// recal-server reading calibration data from a bucket (--data_root=s3://BUCKET/PREFIX) on
// moto_server (a real S3-compatible server on loopback, authentication on; skipped, saying
// so, where moto_server is not installed). The sandboxed worker has no network and no
// credentials: the server reads for it (server/jobs/remote_reads.h). A job on an .npy file
// and one on an image folder in the bucket give the same bytes as the same jobs on the same
// files on disk, sharded too; what is missing is NOT_FOUND naming it, what lies outside the
// roots is refused at submit, and an endpoint stopped mid-job fails that job with
// UNAVAILABLE while the server stays up.
#include <chrono>
#include <filesystem>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/s3/moto_server.h"
#include "tests/server/calls.h"
#include "tests/server/server_process.h"
#include "tests/store/shared_moto.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

using ::testing::HasSubstr;

const std::string kFixtures = RECAL_FIXTURES_DIR;
const std::string kResNet = kFixtures + "/models/resnet18.traced_eval.pt";

struct Results {
  v1::Job job;
  std::string model, bn;
};

// Runs `request` on `server` to its end and downloads what it made.
Results RunJob(const ServerProcess& server, v1::SubmitJobRequest request) {
  auto stub = server.Stub();
  v1::Model model;
  grpc::Status uploaded = Upload(*stub, ReadBytes(kResNet), &model);
  EXPECT_TRUE(uploaded.ok()) << uploaded.error_message();
  request.mutable_spec()->set_model_id(model.id());
  grpc::ClientContext context;
  v1::Job job;
  grpc::Status submitted = stub->SubmitJob(&context, request, &job);
  EXPECT_TRUE(submitted.ok()) << submitted.error_message();
  Results out;
  out.job = WaitForState(*stub, job.id(), v1::SUCCEEDED, 300);
  if (out.job.state() != v1::SUCCEEDED) {
    ADD_FAILURE() << job.id() << " ended " << v1::JobState_Name(out.job.state()) << ": "
                  << out.job.error().message() << "\n" << server.log();
    return out;
  }
  grpc::Status status;
  out.model = Download(*stub, job.id(), v1::MODEL, &status);
  EXPECT_TRUE(status.ok()) << status.error_message();
  out.bn = Download(*stub, job.id(), v1::BN_BUFFERS, &status);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return out;
}

class S3DataServerTest : public store::testing::SharedMotoTest {
 protected:
  void SetUp() override {
    SharedMotoTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    // The same data on disk (the local root) and in the bucket (the s3:// root).
    std::filesystem::create_directories(tmp_.File("local"));
    ASSERT_EQ(MakeImageFolders(tmp_.File("local")), 0);
    std::filesystem::copy_file(kFixtures + "/data/resnet18.npy", tmp_.File("local/root/resnet18.npy"));
    UploadTree(*client_, bucket_);
  }

  // The local root's files under data/ in `bucket`.
  void UploadTree(s3::S3Client& client, const std::string& bucket) {
    const std::filesystem::path root = tmp_.File("local/root");
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
      if (!entry.is_regular_file()) continue;
      const std::string key = "data/" + std::filesystem::relative(entry.path(), root).string();
      ASSERT_TRUE(client.PutObject(bucket, key, ReadBytes(entry.path().string())).ok()) << key;
    }
  }

  std::vector<std::string> Flags(const std::string& endpoint, const s3::Credentials& credentials,
                                 const std::string& bucket) {
    std::vector<std::string> flags = store::testing::ServerS3Flags(endpoint, credentials, tmp_.File("secret"));
    flags.push_back("--data_root=" + tmp_.File("local/root"));
    flags.push_back(absl::StrCat("--data_root=s3://", bucket, "/data"));
    return flags;
  }
  std::vector<std::string> Flags() { return Flags(endpoint(), moto_->credentials, bucket_); }
  std::string InBucket(const std::string& key, const std::string& bucket = "") const {
    return absl::StrCat("s3://", bucket.empty() ? bucket_ : bucket, "/data/", key);
  }

  TempDir tmp_;
};

TEST_F(S3DataServerTest, AJobOnATensorFileInTheBucketMatchesTheSameJobOnDiskBitForBit) {
  ServerProcess server(tmp_.File("data"), Flags());
  ASSERT_TRUE(server.ok()) << server.log();
  const Results on_disk = RunJob(server, NpyJob("", "resnet18.npy", 8));
  const Results in_bucket = RunJob(server, NpyJob("", InBucket("resnet18.npy"), 8));
  ASSERT_FALSE(on_disk.bn.empty());
  EXPECT_TRUE(in_bucket.bn == on_disk.bn) << "BatchNorm buffers differ";
  EXPECT_TRUE(in_bucket.model == on_disk.model) << "recalibrated models differ";
  EXPECT_EQ(in_bucket.job.progress().samples_done(), 20);
  // Read by ranges: one HEAD by the server, then GETs of the header and of each of the three batches.
  EXPECT_EQ(s3::testing::CountRequests(moto_->server->log(), "HEAD",
                                       absl::StrCat("/", bucket_, "/data/resnet18.npy")),
            1);
  EXPECT_GE(s3::testing::CountRequests(moto_->server->log(), "GET",
                                       absl::StrCat("/", bucket_, "/data/resnet18.npy")),
            4);

  // Sharded: each shard's worker reads its own batches through its own runner.
  v1::SubmitJobRequest sharded = NpyJob("", InBucket("resnet18.npy"), 8);
  sharded.mutable_spec()->set_shards(2);
  v1::SubmitJobRequest sharded_on_disk = NpyJob("", "resnet18.npy", 8);
  sharded_on_disk.mutable_spec()->set_shards(2);
  const Results shards_in_bucket = RunJob(server, sharded);
  EXPECT_TRUE(shards_in_bucket.bn == RunJob(server, sharded_on_disk).bn) << "sharded: BatchNorm buffers differ";
  // The credentials are the server's; no job's worker sees them, nor does the log.
  EXPECT_THAT(server.log(), ::testing::Not(HasSubstr(moto_->credentials.secret_access_key)));
}

TEST_F(S3DataServerTest, AJobOnAnImageFolderInTheBucketMatchesTheSameFolderOnDiskBitForBit) {
  // On a moto of its own without authentication: moto checks a signature against the URL as
  // werkzeug re-renders it, with the %2F of a query value decoded back to '/', so it refuses
  // every listing of a prefix holding '/', although it is signed as S3 requires (SigV4: '/'
  // is encoded in query values; checked by AWS's vectors in tests/s3/sigv4_test.cc).
  auto plain = s3::testing::MotoServer::Start(s3::testing::FindOnPath("moto_server"), tmp_.File("plain-moto.log"));
  ASSERT_NE(plain, nullptr);
  const s3::Credentials any{"AKIAEXAMPLE", "unchecked", ""};
  auto client = s3::S3Client::Create(s3::testing::FastClientOptions(plain->endpoint(), any));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateBucket("images").ok());
  UploadTree(**client, "images");
  ServerProcess server(tmp_.File("data"), Flags(plain->endpoint(), any, "images"));
  ASSERT_TRUE(server.ok()) << server.log();
  const Results on_disk = RunJob(server, ImageJob("", "imgs"));
  const Results in_bucket = RunJob(server, ImageJob("", InBucket("imgs/", "images")));
  ASSERT_FALSE(on_disk.bn.empty());
  EXPECT_EQ(in_bucket.job.progress().samples_done(), kImageFolderImages);
  EXPECT_TRUE(in_bucket.bn == on_disk.bn) << "BatchNorm buffers differ";
  EXPECT_TRUE(in_bucket.model == on_disk.model) << "recalibrated models differ";
  // One listing by the server; each image fetched once, by the worker through it.
  EXPECT_EQ(s3::testing::CountRequests(plain->log(), "GET", "/images?list-type=2"), 1);
  EXPECT_EQ(s3::testing::CountRequests(plain->log(), "GET", "/images/data/imgs/"), kImageFolderImages);

  // A prefix without images: NOT_FOUND when the job runs.
  auto stub = server.Stub();
  v1::Model model;
  ASSERT_TRUE(Upload(*stub, ReadBytes(kResNet), &model).ok());
  grpc::ClientContext context;
  v1::Job job;
  ASSERT_TRUE(stub->SubmitJob(&context, ImageJob(model.id(), InBucket("nothing-here/", "images")), &job).ok());
  v1::Job failed = WaitForState(*stub, job.id(), v1::FAILED, 120);
  EXPECT_EQ(failed.error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND)) << failed.error().message();
}

TEST_F(S3DataServerTest, MissingDataIsNotFoundAndDataOutsideTheRootsIsRefusedAtSubmit) {
  ServerProcess server(tmp_.File("data"), Flags());
  ASSERT_TRUE(server.ok()) << server.log();
  auto stub = server.Stub();
  v1::Model model;
  ASSERT_TRUE(Upload(*stub, ReadBytes(kResNet), &model).ok());
  auto submit = [&](const v1::SubmitJobRequest& request, v1::Job* job) {
    grpc::ClientContext context;
    return stub->SubmitJob(&context, request, job);
  };
  v1::Job job;
  // Accepted at submit (the api asks nothing of the endpoint), failed by the worker's runner.
  ASSERT_TRUE(submit(NpyJob(model.id(), InBucket("no-such.npy"), 8), &job).ok());
  v1::Job failed = WaitForState(*stub, job.id(), v1::FAILED, 120);
  EXPECT_EQ(failed.error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND)) << failed.error().message();
  EXPECT_THAT(failed.error().message(), HasSubstr(InBucket("no-such.npy")));

  // Another bucket, another prefix, a prefix that only starts like the root, a path that
  // climbs out, a host of the caller's choosing: refused before any request is made.
  for (const std::string& path :
       {absl::StrCat("s3://other-", bucket_, "/data/resnet18.npy"), absl::StrCat("s3://", bucket_, "/secret/x.npy"),
        absl::StrCat("s3://", bucket_, "/database/x.npy"), absl::StrCat("s3://", bucket_, "/data/../secret/x.npy"),
        std::string("s3://user@169.254.169.254:80/data/x.npy")}) {
    grpc::Status refused = submit(NpyJob(model.id(), path, 8), &job);
    EXPECT_TRUE(refused.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                refused.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
        << path << ": " << refused.error_code() << " " << refused.error_message();
  }
  // torch.save files are unpickled whole: local paths only.
  v1::SubmitJobRequest torch = NpyJob(model.id(), InBucket("resnet18.npy"), 8);
  torch.mutable_spec()->mutable_data()->mutable_tensor_file()->set_format(v1::TensorFileSource::TORCH);
  grpc::Status refused = submit(torch, &job);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  const std::string log = ReadBytes(moto_->server->log());
  EXPECT_EQ(log.find("/secret/"), std::string::npos) << "a refused path reached the endpoint";
  EXPECT_EQ(log.find("/database/"), std::string::npos);
}

TEST_F(S3DataServerTest, AnEndpointStoppedMidJobFailsItUnavailableAndTheServerStaysUp) {
  // An endpoint of this test's own, to stop, holding a file of 200 batches of two samples.
  auto own = s3::testing::MotoServer::Start(s3::testing::FindOnPath("moto_server"), tmp_.File("own-moto.log"));
  ASSERT_NE(own, nullptr);
  auto credentials = s3::testing::EnableAuth(own->endpoint());
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto client = s3::S3Client::Create(s3::testing::FastClientOptions(own->endpoint(), *credentials));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateBucket("stopped").ok());
  std::vector<float> values(400 * 3 * 64 * 64, 0.5f);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 977) / 977.0f;
  ASSERT_TRUE((*client)
                  ->PutObject("stopped", "data/long.npy",
                              NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (400, 3, 64, 64), }",
                                      BytesOf(values)))
                  .ok());
  ServerProcess server(tmp_.File("data"), Flags(own->endpoint(), *credentials, "stopped"));
  ASSERT_TRUE(server.ok()) << server.log();
  auto stub = server.Stub();
  v1::Model model;
  ASSERT_TRUE(Upload(*stub, ReadBytes(kResNet), &model).ok());
  grpc::ClientContext context;
  v1::Job job;
  ASSERT_TRUE(stub->SubmitJob(&context, NpyJob(model.id(), "s3://stopped/data/long.npy", 2), &job).ok());
  // Mid-job: once a batch has gone through.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  v1::Job seen;
  while (std::chrono::steady_clock::now() < deadline) {
    grpc::ClientContext get_context;
    v1::GetJobRequest get;
    get.set_id(job.id());
    ASSERT_TRUE(stub->GetJob(&get_context, get, &seen).ok());
    if (seen.progress().batches_done() >= 1 || seen.state() == v1::SUCCEEDED || seen.state() == v1::FAILED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(seen.state(), v1::RUNNING) << "the job ended before the endpoint could be stopped";
  own->Stop();

  v1::Job failed = WaitForState(*stub, job.id(), v1::FAILED, 240);
  EXPECT_EQ(failed.state(), v1::FAILED) << server.log();
  EXPECT_EQ(failed.error().code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE)) << failed.error().message();
  EXPECT_THAT(failed.error().message(), HasSubstr(own->endpoint().substr(7))) << "names the endpoint";
  EXPECT_LT(failed.progress().batches_done(), 200);

  // The server is up: healthy, and the next job (on disk) runs.
  EXPECT_EQ(server.Health(), grpc::health::v1::HealthCheckResponse::SERVING);
  const Results next = RunJob(server, NpyJob("", "resnet18.npy", 8));
  EXPECT_FALSE(next.bn.empty());
}

}  // namespace
}  // namespace recal::testing
