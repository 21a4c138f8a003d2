// recal::Client against a scripted in-process server that breaks on cue: retries and
// their limits, the request_id that makes submit safe to retry, the bearer token, and
// uploads, downloads and watches that resume where they broke off. Plus the data helpers.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <mutex>

#include "absl/time/clock.h"
#include "common/formats/safetensors.h"
#include "common/sha256.h"
#include "recal/client.h"
#include "recal/data.h"
#include "recal/v1/recal.grpc.pb.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

grpc::Status Unavailable() { return grpc::Status(grpc::StatusCode::UNAVAILABLE, "scripted outage"); }

std::string Pattern(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>((i * 131 + i / 7) & 0xff);
  return bytes;
}

// Fails on cue; records what clients sent.
class FakeRecal final : public v1::Recal::Service {
 public:
  std::mutex mu;
  int get_job_failures = 0;  // GetJob answers UNAVAILABLE this many times first
  int get_job_calls = 0;
  int submit_calls = 0;
  std::vector<std::string> request_ids;
  std::vector<std::string> authorization;
  int delete_calls = 0;
  std::string artifact;              // what DownloadResult serves
  std::string announced_sha256;      // what it says the digest is
  bool break_first_download = true;  // the first stream stops after one chunk
  std::vector<int64_t> download_offsets;
  std::string uploaded;            // committed upload bytes
  bool break_first_upload = true;  // the first stream stops after one chunk
  std::vector<int64_t> upload_starts;
  std::vector<int64_t> watch_after;  // after_seq of each WatchJob
  bool watch_always_fails = false;

  // The test sets and reads the fields above between its calls, the handlers on gRPC's
  // threads: both sides hold mu, since what orders them (a call's reply) is inside gRPC,
  // where ThreadSanitizer cannot see it.
  template <typename F>
  auto Locked(F f) {
    std::lock_guard<std::mutex> lock(mu);
    return f();
  }

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request, v1::Job* job) override {
    std::lock_guard<std::mutex> lock(mu);
    ++get_job_calls;
    if (request->id() == "missing") return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job 'missing'");
    if (get_job_failures > 0) {
      --get_job_failures;
      return Unavailable();
    }
    job->set_id(request->id());
    job->set_state(v1::SUCCEEDED);
    return grpc::Status::OK;
  }

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* job) override {
    std::lock_guard<std::mutex> lock(mu);
    request_ids.push_back(request->request_id());
    auto token = context->client_metadata().find("authorization");
    authorization.push_back(token == context->client_metadata().end()
                                ? ""
                                : std::string(token->second.data(), token->second.size()));
    // The first reply is "lost": the job was made, the client hears UNAVAILABLE.
    if (++submit_calls == 1) return Unavailable();
    job->set_id("job-for-" + request->request_id());
    return grpc::Status::OK;
  }

  grpc::Status DeleteModel(grpc::ServerContext*, const v1::DeleteModelRequest*,
                           v1::DeleteModelResponse*) override {
    std::lock_guard<std::mutex> lock(mu);
    ++delete_calls;
    return Unavailable();
  }

  grpc::Status DownloadResult(grpc::ServerContext*, const v1::DownloadResultRequest* request,
                              grpc::ServerWriter<v1::DownloadResultChunk>* writer) override {
    bool break_now;
    std::string served, digest;
    {
      std::lock_guard<std::mutex> lock(mu);
      download_offsets.push_back(request->offset());
      break_now = break_first_download;
      break_first_download = false;
      served = artifact;
      digest = announced_sha256;
    }
    constexpr int64_t kChunk = 1 << 20;
    bool first = true;
    for (int64_t offset = request->offset(); offset < static_cast<int64_t>(served.size());
         offset += kChunk) {
      v1::DownloadResultChunk chunk;
      chunk.set_offset(offset);
      chunk.set_data(served.substr(offset, kChunk));
      chunk.set_total_size(served.size());
      if (first) chunk.set_sha256(digest);
      first = false;
      writer->Write(chunk);
      if (break_now) return Unavailable();
    }
    return grpc::Status::OK;
  }

  grpc::Status GetModel(grpc::ServerContext*, const v1::GetModelRequest* request, v1::Model* model) override {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such model");
  }

  grpc::Status GetUploadStatus(grpc::ServerContext*, const v1::GetUploadStatusRequest* request,
                               v1::UploadStatus* status) override {
    std::lock_guard<std::mutex> lock(mu);
    status->set_sha256(request->sha256());
    status->set_committed_size(uploaded.size());
    return grpc::Status::OK;
  }

  grpc::Status UploadModel(grpc::ServerContext*, grpc::ServerReader<v1::UploadModelRequest>* reader,
                           v1::Model* model) override {
    v1::UploadModelRequest message;
    if (!reader->Read(&message) || !message.has_header()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "");
    }
    const v1::UploadHeader header = message.header();
    std::lock_guard<std::mutex> lock(mu);
    bool first_chunk = true;
    while (reader->Read(&message)) {
      if (message.chunk().offset() != static_cast<int64_t>(uploaded.size())) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "offset is not the committed size");
      }
      if (first_chunk) upload_starts.push_back(message.chunk().offset());
      first_chunk = false;
      uploaded += message.chunk().data();
      if (break_first_upload) {
        break_first_upload = false;
        return Unavailable();
      }
    }
    if (Sha256Hex(uploaded) != header.sha256()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "digest");
    }
    model->set_id("sha256:" + header.sha256());
    return grpc::Status::OK;
  }

  // seq 1..3 (QUEUED, RUNNING, progress) then a break; resumed: SUCCEEDED as seq 4.
  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      watch_after.push_back(request->after_seq());
      if (watch_always_fails) return Unavailable();
    }
    v1::JobEvent snapshot;
    snapshot.set_seq(request->after_seq());
    snapshot.mutable_snapshot()->set_id(request->id());
    writer->Write(snapshot);
    if (request->after_seq() == 0) {
      for (int seq = 1; seq <= 3; ++seq) {
        v1::JobEvent event;
        event.set_seq(seq);
        if (seq == 1) event.set_state(v1::QUEUED);
        if (seq == 2) event.set_state(v1::RUNNING);
        if (seq == 3) event.mutable_progress()->set_batches_done(1);
        writer->Write(event);
      }
      return Unavailable();
    }
    v1::JobEvent done;
    done.set_seq(4);
    done.set_state(v1::SUCCEEDED);
    writer->Write(done);
    return grpc::Status::OK;
  }
};

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&fake_);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr);
    target_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override { server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1))); }

  std::unique_ptr<Client> Connect(ClientOptions options = {}) {
    options.retry.initial_backoff = absl::Milliseconds(10);
    options.retry.max_backoff = absl::Milliseconds(100);
    auto client = Client::Connect(target_, options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  FakeRecal fake_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  TempDir tmp_;
};

TEST_F(FaultTest, IdempotentCallsAreRetriedOnUnavailableOnly) {
  ClientOptions options;
  options.retry.max_attempts = 3;
  auto client = Connect(options);
  fake_.Locked([&] { fake_.get_job_failures = 2; });
  auto job = client->Get("j1");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(fake_.Locked([&] { return fake_.get_job_calls; }), 3);

  fake_.Locked([&] { fake_.get_job_failures = 5; });
  auto gave_up = client->Get("j1");
  EXPECT_EQ(gave_up.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(gave_up.status().message(), HasSubstr(target_));
  EXPECT_EQ(fake_.Locked([&] { return fake_.get_job_calls; }), 6);

  // The server's own answers are not retried, nor is a non-idempotent delete.
  fake_.Locked([&] { fake_.get_job_failures = 0; });
  EXPECT_EQ(client->Get("missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fake_.Locked([&] { return fake_.get_job_calls; }), 7);
  EXPECT_EQ(client->DeleteModel("sha256:x").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fake_.Locked([&] { return fake_.delete_calls; }), 1);
}

TEST_F(FaultTest, ARetriedSubmitCarriesTheSameRequestIdAndTheToken) {
  ClientOptions options;
  options.bearer_token = "s3cret";
  auto client = Connect(options);
  auto job = client->Submit(v1::JobSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<std::string> ids = fake_.Locked([&] { return fake_.request_ids; });
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0], ids[1]);
  EXPECT_EQ(ids[0].size(), 32u);
  EXPECT_EQ(job->id(), "job-for-" + ids[0]);
  EXPECT_THAT(fake_.Locked([&] { return fake_.authorization; }), ElementsAre("Bearer s3cret", "Bearer s3cret"));
  EXPECT_NE(Client::NewRequestId(), Client::NewRequestId());
}

TEST_F(FaultTest, DownloadsResumeAfterABrokenStreamAndVerifyTheDigest) {
  fake_.Locked([&] {
    fake_.artifact = Pattern((3 << 20) + 12345);
    fake_.announced_sha256 = Sha256Hex(fake_.artifact);
  });
  auto client = Connect();
  const std::string path = tmp_.File("model.pt");
  auto downloaded = client->Download("j1", v1::MODEL, path);
  ASSERT_TRUE(downloaded.ok()) << downloaded.status();
  EXPECT_EQ(downloaded->resumes, 1);
  EXPECT_THAT(fake_.Locked([&] { return fake_.download_offsets; }), ElementsAre(0, 1 << 20));
  EXPECT_EQ(ReadBytes(path), fake_.Locked([&] { return fake_.artifact; }));

  // A digest that does not match: DATA_LOSS, and the old file stays as it was.
  fake_.Locked([&] { fake_.announced_sha256 = std::string(64, 'a'); });
  auto corrupt = client->Download("j1", v1::MODEL, path);
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadBytes(path), fake_.Locked([&] { return fake_.artifact; }));
  EXPECT_THAT(tmp_.List(), ElementsAre("model.pt"));
}

TEST_F(FaultTest, UploadsResumeFromTheCommittedSize) {
  // A zip's magic and no directory: the client leaves the judgement to the server.
  const std::string bytes = "PK\x03\x04" + Pattern(300000);
  const std::string path = tmp_.File("model.pt");
  WriteBytes(path, bytes);
  ClientOptions options;
  options.chunk_bytes = 64 << 10;
  auto client = Connect(options);
  auto uploaded = client->UploadModel(path);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  EXPECT_EQ(uploaded->model.id(), "sha256:" + Sha256Hex(bytes));
  EXPECT_EQ(uploaded->resumed_from, 64 << 10);
  EXPECT_THAT(fake_.Locked([&] { return fake_.upload_starts; }), ElementsAre(0, 64 << 10));
  EXPECT_EQ(fake_.Locked([&] { return fake_.uploaded; }), bytes);
}

TEST_F(FaultTest, WatchResumesFromTheLastSeqAndGivesUpAfterTheTimeout) {
  auto client = Connect();
  std::vector<int64_t> seqs;
  int snapshots = 0;
  auto job = client->Watch("j1", [&](const v1::JobEvent& e) {
    if (e.has_snapshot()) {
      ++snapshots;
    } else {
      seqs.push_back(e.seq());
    }
  });
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED);
  EXPECT_THAT(seqs, ElementsAre(1, 2, 3, 4));
  EXPECT_EQ(snapshots, 2);
  EXPECT_THAT(fake_.Locked([&] { return fake_.watch_after; }), ElementsAre(0, 3));

  fake_.Locked([&] { fake_.watch_always_fails = true; });
  ClientOptions options;
  options.reconnect_timeout = absl::Milliseconds(300);
  auto impatient = Connect(options);
  const absl::Time start = absl::Now();
  EXPECT_EQ(impatient->Watch("j1", nullptr).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(ConnectTest, RefusesWhatCannotWork) {
  EXPECT_EQ(Client::Connect("", {}).status().code(), absl::StatusCode::kInvalidArgument);
  ClientOptions tls;
  tls.tls_root_certs_file = "/nonexistent/ca.pem";
  EXPECT_EQ(Client::Connect("localhost:1", tls).status().code(), absl::StatusCode::kNotFound);
  tls.tls_root_certs_file.clear();
  tls.tls = true;  // system roots
  EXPECT_TRUE(Client::Connect("localhost:1", tls).ok());
}

TEST(DataTest, SpecsMapToTypedSources) {
  auto npy = DataSourceFromSpec("npy:data/x.npy");
  ASSERT_TRUE(npy.ok());
  EXPECT_EQ(npy->tensor_file().format(), v1::TensorFileSource::NPY);
  EXPECT_EQ(npy->tensor_file().path(), "data/x.npy");
  auto st = DataSourceFromSpec("safetensors:/d/x.safetensors:a,b");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->tensor_file().format(), v1::TensorFileSource::SAFETENSORS);
  EXPECT_THAT(st->tensor_file().keys(), ElementsAre("a", "b"));
  auto torch = DataSourceFromSpec("torch:x.pt");
  ASSERT_TRUE(torch.ok());
  EXPECT_EQ(torch->tensor_file().format(), v1::TensorFileSource::TORCH);
  auto synthetic = DataSourceFromSpec("synthetic:3x32x32,seed=7");
  ASSERT_TRUE(synthetic.ok());
  EXPECT_THAT(synthetic->synthetic().sample_shape(), ElementsAre(3, 32, 32));
  EXPECT_EQ(synthetic->synthetic().seed(), 7);
  for (const char* spec :
       {"npy:data/x.npy", "safetensors:/d/x.safetensors:a,b", "torch:x.pt", "synthetic:3x32x32,seed=7"}) {
    EXPECT_EQ(DataSourceToSpec(*DataSourceFromSpec(spec)), spec);
  }
  EXPECT_EQ(DataSourceFromSpec("png:x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DataSourceFromSpec("synthetic:3xq").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DataTest, ImageSpecsMapToImageFolderSources) {
  auto images = DataSourceFromSpec("images:calib/imgs?resize=36&crop=32&mean=0.485,0.456,0.406&std=0.229,0.224,0.225");
  ASSERT_TRUE(images.ok()) << images.status();
  const v1::ImageFolderSource& folder = images->image_folder();
  EXPECT_EQ(folder.path(), "calib/imgs");
  EXPECT_EQ(folder.resize(), 36);
  EXPECT_EQ(folder.crop(), 32);
  EXPECT_THAT(folder.mean(), ElementsAre(0.485f, 0.456f, 0.406f));
  EXPECT_THAT(folder.std(), ElementsAre(0.229f, 0.224f, 0.225f));
  EXPECT_EQ(folder.samples(), 0) << "all";
  EXPECT_FALSE(folder.shuffle());
  EXPECT_EQ(folder.on_bad(), v1::ImageFolderSource::FAIL);

  auto options = DataSourceFromSpec(
      "images:/d/a?b:c?resize=8&crop=8&mean=0,0,0&std=1,1,1&samples=5&shuffle=1&seed=18446744073709551615&on_bad=skip");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->image_folder().path(), "/d/a?b:c") << "the options start at the last '?'";
  EXPECT_EQ(options->image_folder().samples(), 5);
  EXPECT_TRUE(options->image_folder().shuffle());
  EXPECT_EQ(options->image_folder().seed(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(options->image_folder().on_bad(), v1::ImageFolderSource::SKIP);

  // The canonical spelling round-trips (on_bad=fail and shuffle=0 are the defaults).
  for (const char* spec : {
           "images:calib/imgs?resize=36&crop=32&mean=0.485,0.456,0.406&std=0.229,0.224,0.225",
           "images:/d/a?b:c?resize=8&crop=8&mean=0,-0.5,1e-07&std=1,2,0.1234567&samples=5&shuffle=1&seed=9&on_bad=skip",
       }) {
    auto source = DataSourceFromSpec(spec);
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_EQ(DataSourceToSpec(*source), spec);
  }
  EXPECT_EQ(DataSourceToSpec(*DataSourceFromSpec("images:d?std=1,1,1&mean=0,0,0&on_bad=fail&crop=4&resize=4&shuffle=0")),
            "images:d?resize=4&crop=4&mean=0,0,0&std=1,1,1");
  // A hand-made message: ON_BAD_UNSPECIFIED fails, samples 0 is all.
  v1::DataSource made;
  made.mutable_image_folder()->set_path("x");
  made.mutable_image_folder()->set_resize(2);
  made.mutable_image_folder()->set_crop(1);
  for (float v : {0.1f, 0.2f, 0.3f}) {
    made.mutable_image_folder()->add_mean(v);
    made.mutable_image_folder()->add_std(v);
  }
  EXPECT_EQ(DataSourceToSpec(made), "images:x?resize=2&crop=1&mean=0.1,0.2,0.3&std=0.1,0.2,0.3");

  // No options: ImageNet's evaluation transform, spelled out in the message the client sends.
  EXPECT_EQ(DataSourceToSpec(*DataSourceFromSpec("images:d")),
            "images:d?resize=256&crop=224&mean=0.485,0.456,0.406&std=0.229,0.224,0.225");
  for (const char* bad : {"images:", "images:d?resize=4&crop=8&mean=0,0,0&std=1,1,1",
                          "images:d?resize=4&crop=4&mean=0,0&std=1,1,1", "images:d?resize=4&crop=4&mean=0,0,0&std=1,0,1",
                          "images:d?resize=4&crop=4&mean=0,0,0&std=1,1,1&on_bad=ignore"}) {
    const auto refused = DataSourceFromSpec(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(DataTest, TensorFileSpecsCarryTheirNormalisation) {
  auto npy = DataSourceFromSpec("npy:calib/u8.npy?scale=255&mean=0.485,0.456,0.406&std=0.229,0.224,0.225");
  ASSERT_TRUE(npy.ok()) << npy.status();
  const v1::TensorFileSource& file = npy->tensor_file();
  EXPECT_EQ(file.format(), v1::TensorFileSource::NPY);
  EXPECT_EQ(file.path(), "calib/u8.npy");
  EXPECT_EQ(file.scale(), 255);
  EXPECT_THAT(file.mean(), ElementsAre(0.485f, 0.456f, 0.406f));
  EXPECT_THAT(file.std(), ElementsAre(0.229f, 0.224f, 0.225f));
  auto plain = DataSourceFromSpec("torch:x.pt");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->tensor_file().scale(), 0);
  EXPECT_TRUE(plain->tensor_file().mean().empty());

  for (const char* spec : {"npy:calib/u8.npy?scale=255&mean=0.485,0.456,0.406&std=0.229,0.224,0.225",
                           "safetensors:/d/x.st:pixels?scale=65535", "torch:x.pt?mean=0.5&std=0.25",
                           "torch:/d/what?.pt?", "safetensors:/d/a:b?.st:?scale=2", "safetensors:/d/x.st:a?b?",
                           "synthetic:3x8x8,seed=18446744073709551615"}) {
    auto source = DataSourceFromSpec(spec);
    ASSERT_TRUE(source.ok()) << spec << ": " << source.status();
    EXPECT_EQ(DataSourceToSpec(*source), spec);
  }
  EXPECT_EQ(DataSourceFromSpec("torch:/d/what?.pt?")->tensor_file().path(), "/d/what?.pt");
  EXPECT_THAT(DataSourceFromSpec("safetensors:/d/x.st:a?b?")->tensor_file().keys(), ElementsAre("a?b"));
  EXPECT_EQ(DataSourceFromSpec("npy:x.npy?mean=0.5").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DataSourceFromSpec("npy:x.npy?scale=0").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DataTest, StreamedFilesKeepTheNormalisationOfTheirSpec) {
  auto from_spec = StreamSourceFromSpec("npy:/local/u8.npy?scale=255&mean=0.5,0.25&std=0.2,0.1", {});
  ASSERT_TRUE(from_spec.ok()) << from_spec.status();
  ASSERT_TRUE(from_spec->has_client_stream());
  EXPECT_EQ(from_spec->client_stream().scale(), 255);
  EXPECT_THAT(from_spec->client_stream().mean(), ElementsAre(0.5f, 0.25f));
  EXPECT_THAT(from_spec->client_stream().std(), ElementsAre(0.2f, 0.1f));
  v1::ClientStreamSource given;
  given.set_scale(65535);
  auto from_options = StreamSourceFromSpec("safetensors:/local/x.st:a", given);
  ASSERT_TRUE(from_options.ok()) << from_options.status();
  EXPECT_EQ(from_options->client_stream().scale(), 65535);
  auto both = StreamSourceFromSpec("npy:/local/u8.npy?scale=255", given);
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(both.status().message(), HasSubstr("give one of them"));
  EXPECT_EQ(StreamSourceFromSpec("npy:x?scale=-1", {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DataTest, LocalFilesAreCutIntoBatches) {
  TempDir tmp;
  std::vector<float> values(20 * 3 * 2);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  const std::string npy = tmp.File("x.npy");
  WriteBytes(npy,
             NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (20, 3, 2), }", BytesOf(values)));
  auto batches = LocalBatches::Open("npy:" + npy, 8);
  ASSERT_TRUE(batches.ok()) << batches.status();
  EXPECT_EQ((*batches)->num_samples(), 20);
  EXPECT_EQ((*batches)->num_batches(), 3);
  std::vector<v1::Tensor> inputs;
  std::vector<int64_t> sizes;
  std::string all;
  while (*(*batches)->Next(&inputs)) {
    ASSERT_EQ(inputs.size(), 1u);
    EXPECT_EQ(inputs[0].dtype(), v1::Tensor::FLOAT32);
    EXPECT_THAT(std::vector<int64_t>(inputs[0].shape().begin() + 1, inputs[0].shape().end()),
                ElementsAre(3, 2));
    sizes.push_back(inputs[0].shape(0));
    all += inputs[0].data();
  }
  EXPECT_THAT(sizes, ElementsAre(8, 8, 4));
  EXPECT_EQ(all, BytesOf(values));

  // Safetensors: the keys given, in order, as positional inputs.
  std::vector<uint8_t> images(20 * 4, 7);
  std::vector<uint16_t> halves(20 * 2, 0x3c00);
  std::vector<double> doubles(20, 1.0);
  const std::string st = tmp.File("x.safetensors");
  ASSERT_TRUE(formats::WriteSafetensors(st, {{"img", "U8", {20, 4}, ViewOf(images)},
                                             {"aux", "F16", {20, 2}, ViewOf(halves)},
                                             {"f64", "F64", {20}, ViewOf(doubles)},
                                             {"short", "U8", {5, 4}, ViewOf(images).substr(0, 20)}})
                  .ok());
  auto two = LocalBatches::Open("safetensors:" + st + ":img,aux", 16);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_TRUE(*(*two)->Next(&inputs));
  ASSERT_EQ(inputs.size(), 2u);
  EXPECT_EQ(inputs[0].dtype(), v1::Tensor::UINT8);
  EXPECT_EQ(inputs[1].dtype(), v1::Tensor::FLOAT16);
  EXPECT_THAT(inputs[1].shape(), ElementsAre(16, 2));
  ASSERT_TRUE(*(*two)->Next(&inputs));
  EXPECT_THAT(inputs[0].shape(), ElementsAre(4, 4));
  EXPECT_FALSE(*(*two)->Next(&inputs));

  EXPECT_THAT(LocalBatches::Open("safetensors:" + st + ":f64", 8).status().message(), HasSubstr("float64"));
  EXPECT_THAT(LocalBatches::Open("safetensors:" + st + ":img,short", 8).status().message(),
              HasSubstr("different numbers of samples"));
  EXPECT_EQ(LocalBatches::Open("safetensors:" + st + ":nope", 8).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(LocalBatches::Open("npy:" + tmp.File("none.npy"), 8).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(LocalBatches::Open("torch:" + npy, 8).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LocalBatches::Open("npy:" + npy, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recal::testing
