// recal-server with --blobs=s3://BUCKET/PREFIX against moto_server (a real S3-compatible
// server on loopback, authentication on; skipped, saying so, where moto_server is not
// installed): models and results round-trip through the bucket and match the same job on local
// blobs byte for byte, downloads resume at an offset, a server killed -9 in the middle of a
// result's multipart upload leaves nothing half-written in the bucket, and an endpoint that stops
// mid-job fails that job with UNAVAILABLE while the server stays up; the model cache keeps to
// --blob_cache_bytes.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "tests/s3/moto_server.h"
#include "tests/server/calls.h"
#include "tests/server/server_process.h"
#include "tests/store/shared_moto.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

using ::testing::HasSubstr;

const std::string kFixtures = RECAL_FIXTURES_DIR;
constexpr char kPrefix[] = "tenants/recal";
constexpr int64_t kPartBytes = int64_t{5} << 20;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The server's object-storage flags: endpoint, and credentials from a mounted-secret directory.
std::vector<std::string> BucketFlags(const std::string& endpoint, const s3::Credentials& credentials,
                                     const std::string& bucket, const std::string& secret_dir) {
  std::vector<std::string> flags = store::testing::ServerS3Flags(endpoint, credentials, secret_dir);
  flags.insert(flags.end(), {absl::StrCat("--blobs=s3://", bucket, "/", kPrefix),
                             absl::StrCat("--blob_part_bytes=", kPartBytes), "--data_root=" + kFixtures});
  return flags;
}

class S3BlobsServerTest : public store::testing::SharedMotoTest {
 protected:
  std::vector<std::string> Flags() {
    return BucketFlags(endpoint(), moto_->credentials, bucket_, tmp_.File("secret"));
  }

  // Every object under the prefix is a whole blob: its bytes hash to the digest its key names.
  // Returns the digests.
  std::set<std::string> ExpectEveryObjectIsWhole() {
    std::set<std::string> digests;
    auto listed = client_->ListObjects(bucket_, "");
    EXPECT_TRUE(listed.ok()) << listed.status();
    if (!listed.ok()) return digests;
    const std::string blobs = absl::StrCat(kPrefix, "/blobs/sha256/");
    for (const s3::ObjectInfo& object : *listed) {
      EXPECT_EQ(object.key.rfind(blobs, 0), 0u) << object.key << " is outside " << blobs;
      const std::string digest = object.key.substr(blobs.size());
      Sha256 hash;
      EXPECT_TRUE(client_->GetObject(bucket_, object.key, [&](absl::string_view piece) {
                           hash.Update(piece);
                           return absl::OkStatus();
                         }).ok());
      EXPECT_EQ(hash.HexDigest(), digest) << object.key << " does not hold the blob it names";
      digests.insert(digest);
    }
    return digests;
  }

  TempDir tmp_;
};

struct Outputs {
  std::string job_id, model, bn;
};

const std::string kMobileNet = kFixtures + "/models/mobilenet_v2.traced_train.pt";

// Uploads MobileNetV2 and runs it on its fixture data. `cache_dir` non-empty: emptied between
// the upload and the job, so that the job's worker fetches the model from the bucket as a
// worker on another host would.
Outputs RunMobileNet(const ServerProcess& server, const std::string& cache_dir = "") {
  auto stub = server.Stub();
  v1::Model model;
  grpc::Status uploaded = Upload(*stub, ReadBytes(kMobileNet), &model);
  EXPECT_TRUE(uploaded.ok()) << uploaded.error_message() << "\n" << server.log();
  if (!cache_dir.empty()) {
    for (const auto& entry : std::filesystem::directory_iterator(cache_dir)) std::filesystem::remove(entry.path());
  }
  grpc::ClientContext context;
  v1::Job job;
  EXPECT_TRUE(stub->SubmitJob(&context, NpyJob(model.id(), "data/mobilenet_v2.npy", 8), &job).ok());
  v1::Job done = WaitForState(*stub, job.id(), v1::SUCCEEDED, 300);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.error().message() << "\n" << server.log();
  Outputs out{job.id()};
  grpc::Status status;
  out.model = Download(*stub, job.id(), v1::MODEL, &status);
  EXPECT_TRUE(status.ok()) << status.error_message();
  out.bn = Download(*stub, job.id(), v1::BN_BUFFERS, &status);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return out;
}

TEST_F(S3BlobsServerTest, ModelsAndResultsRoundTripThroughTheBucketAndMatchLocalBlobs) {
  ServerProcess server(tmp_.File("data"), Flags());
  ASSERT_TRUE(server.ok()) << server.log();
  EXPECT_THAT(server.log(), HasSubstr(absl::StrCat("blobs=s3://", bucket_, "/", kPrefix, "/")));
  const std::string cache = tmp_.File("data/s3-blobs/cache/sha256");
  const Outputs bucket = RunMobileNet(server, cache);
  ASSERT_FALSE(bucket.model.empty());
  // The job fetched its model from the bucket into the cache, verified.
  EXPECT_EQ(ReadBytes(cache + "/" + *Sha256OfFile(kMobileNet)), ReadBytes(kMobileNet));

  // The model (9 MB: a multipart upload of 5 MiB parts) and the three results are objects
  // named by their digests, each whole; nothing of them is kept on the server's disk but the
  // cache of the model the job ran.
  const std::set<std::string> digests = ExpectEveryObjectIsWhole();
  EXPECT_EQ(digests.size(), 4u);
  EXPECT_TRUE(digests.count(Sha256Hex(bucket.model))) << "the recalibrated model is in the bucket";
  EXPECT_TRUE(digests.count(Sha256Hex(bucket.bn)));
  EXPECT_TRUE(digests.count(*Sha256OfFile(kMobileNet)));
  EXPECT_TRUE(std::filesystem::is_empty(tmp_.File("data/s3-blobs/tmp")));

  // A download resumes at any offset: ranged GETs of the object.
  auto stub = server.Stub();
  grpc::Status status;
  EXPECT_EQ(Download(*stub, bucket.job_id, v1::MODEL, &status, 1000), bucket.model.substr(1000));
  EXPECT_TRUE(status.ok()) << status.error_message();
  const int64_t late = static_cast<int64_t>(bucket.model.size()) - 12345;
  EXPECT_EQ(Download(*stub, bucket.job_id, v1::MODEL, &status, late), bucket.model.substr(late));
  Download(*stub, bucket.job_id, v1::MODEL, &status, static_cast<int64_t>(bucket.model.size()) + 1);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE) << status.error_message();

  // The same job on local blobs: the same bytes.
  ServerProcess local(tmp_.File("local"), {"--data_root=" + kFixtures});
  ASSERT_TRUE(local.ok()) << local.log();
  const Outputs on_disk = RunMobileNet(local);
  EXPECT_TRUE(bucket.model == on_disk.model) << "recalibrated models differ";
  EXPECT_TRUE(bucket.bn == on_disk.bn) << "BatchNorm buffers differ";

  // The credentials are the server's configuration; they never appear in what it says.
  EXPECT_THAT(server.log(), ::testing::Not(HasSubstr(moto_->credentials.secret_access_key)));
}

// --blob_cache_bytes: once the cached models pass the bound, the least recently used goes
// (the test ages the entry rather than waiting out the cache's grace of a minute); a job on
// the dropped model fetches it again from the bucket.
TEST_F(S3BlobsServerTest, TheModelCacheKeepsToItsBoundAndAJobFetchesADroppedModelAgain) {
  std::vector<std::string> flags = Flags();
  flags.push_back("--blob_cache_bytes=1");
  ServerProcess server(tmp_.File("data"), flags);
  ASSERT_TRUE(server.ok()) << server.log();
  auto stub = server.Stub();
  const std::string cache = tmp_.File("data/s3-blobs/cache/sha256");
  v1::Model mobilenet;
  grpc::Status uploaded = Upload(*stub, ReadBytes(kMobileNet), &mobilenet);
  ASSERT_TRUE(uploaded.ok()) << uploaded.error_message();
  const std::string entry = cache + "/" + *Sha256OfFile(kMobileNet);
  ASSERT_TRUE(std::filesystem::exists(entry));
  const auto two_hours_ago = std::filesystem::file_time_type::clock::now() - std::chrono::hours(2);
  std::filesystem::last_write_time(entry, two_hours_ago);

  const std::string other = kFixtures + "/models/functional.traced_train.pt";
  v1::Model small;
  uploaded = Upload(*stub, ReadBytes(other), &small);
  ASSERT_TRUE(uploaded.ok()) << uploaded.error_message();
  EXPECT_FALSE(std::filesystem::exists(entry)) << "the least recently used model stayed over the bound";
  EXPECT_TRUE(std::filesystem::exists(cache + "/" + *Sha256OfFile(other))) << "the new entry is within the grace";

  grpc::ClientContext context;
  v1::Job job;
  ASSERT_TRUE(stub->SubmitJob(&context, NpyJob(mobilenet.id(), "data/mobilenet_v2.npy", 8), &job).ok());
  const v1::Job done = WaitForState(*stub, job.id(), v1::SUCCEEDED, 300);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.error().message() << "\n" << server.log();
  EXPECT_EQ(ReadBytes(entry), ReadBytes(kMobileNet)) << "fetched again, verified";
}

TEST_F(S3BlobsServerTest, AServerKilledMidUploadOfAResultLeavesNothingHalfWritten) {
  const std::string model_path = kFixtures + "/models/resnet18.traced_train.pt";  // 45 MB: nine parts
  const std::string model_digest = *Sha256OfFile(model_path);
  const std::string data_dir = tmp_.File("data");
  std::string job_id;
  std::string killed_key;
  {
    ServerProcess server(data_dir, Flags());
    ASSERT_TRUE(server.ok()) << server.log();
    auto stub = server.Stub();
    v1::Model model;
    grpc::Status uploaded = Upload(*stub, ReadBytes(model_path), &model);
    ASSERT_TRUE(uploaded.ok()) << uploaded.error_message() << "\n" << server.log();
    v1::SubmitJobRequest request = LongJob(model.id());
    request.mutable_spec()->mutable_options()->set_max_batches(2);
    grpc::ClientContext context;
    v1::Job job;
    ASSERT_TRUE(stub->SubmitJob(&context, request, &job).ok());
    job_id = job.id();

    // The first part of a blob other than the model: the recalibrated model's upload has begun.
    const std::regex part(absl::StrCat("\"PUT /", bucket_, "/(", kPrefix, "/blobs/sha256/([0-9a-f]{64}))\\?partNumber=1&"));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
    while (killed_key.empty() && std::chrono::steady_clock::now() < deadline) {
      const std::string log = ReadFile(moto_->server->log());
      for (std::sregex_iterator it(log.begin(), log.end(), part), end; it != end; ++it) {
        if ((*it)[2] != model_digest) killed_key = (*it)[1];
      }
      if (killed_key.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_FALSE(killed_key.empty()) << "no result upload seen\n" << server.log();
    server.Kill();
  }
  // The object whose upload was cut off does not exist; nothing in the bucket is partial.
  EXPECT_TRUE(absl::IsNotFound(client_->HeadObject(bucket_, killed_key).status()))
      << killed_key << " appeared although its upload was cut off";
  std::set<std::string> digests = ExpectEveryObjectIsWhole();
  EXPECT_TRUE(digests.count(model_digest));

  // Started again, the job runs again and its results are stored whole.
  ServerProcess again(data_dir, Flags());
  ASSERT_TRUE(again.ok()) << again.log();
  auto stub = again.Stub();
  v1::Job done = WaitForState(*stub, job_id, v1::SUCCEEDED, 300);
  EXPECT_EQ(done.attempts(), 2);
  grpc::Status status;
  const std::string result = Download(*stub, job_id, v1::MODEL, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  digests = ExpectEveryObjectIsWhole();
  EXPECT_TRUE(digests.count(Sha256Hex(result)));
}

TEST_F(S3BlobsServerTest, AnEndpointStoppedMidJobFailsItUnavailableAndTheServerStaysUp) {
  // An endpoint of this test's own, to stop.
  auto own = s3::testing::MotoServer::Start(s3::testing::FindOnPath("moto_server"), tmp_.File("own-moto.log"));
  ASSERT_NE(own, nullptr);
  auto credentials = s3::testing::EnableAuth(own->endpoint());
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto client = s3::S3Client::Create(s3::testing::FastClientOptions(own->endpoint(), *credentials));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateBucket("stopped").ok());
  ServerProcess server(tmp_.File("data"), BucketFlags(own->endpoint(), *credentials, "stopped", tmp_.File("secret")));
  ASSERT_TRUE(server.ok()) << server.log();
  auto stub = server.Stub();
  v1::Model model;
  ASSERT_TRUE(Upload(*stub, ReadBytes(kFixtures + "/models/resnet18.traced_eval.pt"), &model).ok());
  v1::SubmitJobRequest request = LongJob(model.id());
  request.mutable_spec()->mutable_options()->set_max_batches(12);
  grpc::ClientContext context;
  v1::Job job;
  ASSERT_TRUE(stub->SubmitJob(&context, request, &job).ok());
  // Mid-job: the model is in this host's cache since its upload; the batches run, then their
  // results cannot be stored.
  WaitForState(*stub, job.id(), v1::RUNNING, 240);
  own->Stop();

  v1::Job failed = WaitForState(*stub, job.id(), v1::FAILED, 240);
  EXPECT_EQ(failed.state(), v1::FAILED) << server.log();
  EXPECT_EQ(failed.error().code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE)) << failed.error().message();
  EXPECT_THAT(failed.error().message(), HasSubstr(own->endpoint().substr(7))) << "names the endpoint";

  // The server is up: healthy, and its other calls work.
  EXPECT_EQ(server.Health(), grpc::health::v1::HealthCheckResponse::SERVING);
  grpc::ClientContext list_context;
  v1::ListModelsResponse models;
  EXPECT_TRUE(stub->ListModels(&list_context, v1::ListModelsRequest(), &models).ok());
  EXPECT_EQ(models.models_size(), 1);
  // A call that needs the bucket fails UNAVAILABLE too, and keeps what it was given: the
  // upload stays staged with every byte committed, to be stored once the endpoint is back.
  const std::string other = ReadBytes(kFixtures + "/models/bn1d_2d.traced_train.pt");
  v1::Model refused;
  grpc::Status upload = Upload(*stub, other, &refused);
  EXPECT_EQ(upload.error_code(), grpc::StatusCode::UNAVAILABLE) << upload.error_message();
  grpc::ClientContext status_context;
  v1::GetUploadStatusRequest status_request;
  status_request.set_sha256(Sha256Hex(other));
  v1::UploadStatus staged;
  EXPECT_TRUE(stub->GetUploadStatus(&status_context, status_request, &staged).ok());
  EXPECT_EQ(staged.committed_size(), static_cast<int64_t>(other.size()));
  grpc::ClientContext get_context;
  v1::GetJobRequest get;
  get.set_id(job.id());
  v1::Job again;
  EXPECT_TRUE(stub->GetJob(&get_context, get, &again).ok());
  EXPECT_EQ(again.state(), v1::FAILED);
}

}  // namespace
}  // namespace recal::testing
