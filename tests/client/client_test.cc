// recal::Client against the real recal-server: every call, the all-in-one Recalibrate
// checked against the float64 reference, and a watch that survives a server restart.
#include "recal/client.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "common/sha256.h"
#include "common/status_macros.h"
#include "recal/data.h"
#include "recal/v1/report.pb.h"
#include "tests/client/client_test_util.h"

namespace recal::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

bool IsHex(const std::string& s, size_t length) {
  return s.size() == length && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

v1::JobSpec NpyJob(const std::string& model_id, const std::string& path = "data/resnet18.npy") {
  v1::JobSpec spec;
  spec.set_model_id(model_id);
  spec.set_batch_size(8);
  *spec.mutable_data() = *DataSourceFromSpec("npy:" + path);
  return spec;
}

// Runs long enough to be cancelled or interrupted: synthetic batches, one thread.
v1::JobSpec LongJob(const std::string& model_id, int64_t batches) {
  v1::JobSpec spec;
  spec.set_model_id(model_id);
  spec.set_batch_size(16);
  *spec.mutable_data() = *DataSourceFromSpec("synthetic:3x64x64,seed=1");
  spec.mutable_options()->set_max_batches(batches);
  return spec;
}

class ClientTest : public ServerTest {
 protected:
  void SetUp() override {
    ServerTest::SetUp();
    if (HasFatalFailure()) return;
    ClientOptions options = Options();
    options.bearer_token = server_->token();
    auto client = Client::Connect(target(), options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }
  virtual ClientOptions Options() { return {}; }
  std::string Upload() {
    auto uploaded = client_->UploadModel(kModel);
    EXPECT_TRUE(uploaded.ok()) << uploaded.status();
    return uploaded.ok() ? uploaded->model.id() : "";
  }

  std::unique_ptr<Client> client_;
};

TEST_F(ClientTest, UploadSkipsKnownModelsAndResumesBrokenUploads) {
  auto first = client_->UploadModel(kModel, "resnet", {{"team", "vision"}});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->already_present);
  EXPECT_EQ(first->bytes_sent, static_cast<int64_t>(fs::file_size(kModel)));
  EXPECT_EQ(first->model.id(), "sha256:" + *Sha256OfFile(kModel));
  EXPECT_EQ(first->model.name(), "resnet");
  EXPECT_EQ(first->model.labels().at("team"), "vision");
  EXPECT_EQ(first->model.layers_size(), 20);

  // The digest is known: nothing is sent.
  auto again = client_->UploadModel(kModel);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->already_present);
  EXPECT_EQ(again->bytes_sent, 0);
  EXPECT_EQ(again->model.id(), first->model.id());

  // An upload broken off after 3 MiB is resumed from there.
  const std::string other = kFixtures + "/models/mobilenet_v2.traced_eval.pt";
  const std::string bytes = ReadBytes(other);
  {
    auto stub = server_->Stub();
    grpc::ClientContext context;
    v1::Model ignored;
    auto writer = stub->UploadModel(&context, &ignored);
    v1::UploadModelRequest header;
    header.mutable_header()->set_size(bytes.size());
    header.mutable_header()->set_sha256(Sha256Hex(bytes));
    writer->Write(header);
    for (int64_t offset = 0; offset < (3 << 20); offset += 1 << 20) {
      v1::UploadModelRequest chunk;
      chunk.mutable_chunk()->set_offset(offset);
      chunk.mutable_chunk()->set_data(bytes.substr(offset, 1 << 20));
      writer->Write(chunk);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the server store them
    context.TryCancel();
    writer->Finish();
  }
  auto resumed = client_->UploadModel(other);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->resumed_from, 3 << 20);
  EXPECT_EQ(resumed->bytes_sent, static_cast<int64_t>(bytes.size()) - (3 << 20));
  EXPECT_EQ(resumed->model.id(), "sha256:" + Sha256Hex(bytes));

  auto listed = client_->ListModels();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->models_size(), 2);
  auto status = client_->GetUploadStatus(Sha256Hex(bytes));
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->model_id(), resumed->model.id());

  EXPECT_EQ(client_->UploadModel(tmp_.File("missing.pt")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->GetModel("sha256:" + std::string(64, '0')).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(client_->DeleteModel(resumed->model.id()).ok());
  EXPECT_EQ(client_->GetModel(resumed->model.id()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, SubmitGetListCancelAndWait) {
  const std::string model_id = Upload();
  auto job = client_->Submit(NpyJob(model_id));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE(IsHex(job->request_id(), 32)) << job->request_id();
  // The same request_id is the same job (what makes a retried submit safe).
  auto first = client_->Submit(NpyJob(model_id), "my-key");
  auto second = client_->Submit(NpyJob(model_id), "my-key");
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->id(), second->id());
  EXPECT_NE(first->id(), job->id());

  auto done = client_->Wait(job->id());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED);
  EXPECT_EQ(done->progress().batches_done(), 3);
  auto got = client_->Get(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state(), v1::SUCCEEDED);

  auto long_job = client_->Submit(LongJob(model_id, 1000));
  ASSERT_TRUE(long_job.ok());
  auto cancelled = client_->Cancel(long_job->id());
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  auto ended = client_->Wait(long_job->id());
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(ended->state(), v1::CANCELLED);
  ASSERT_TRUE(client_->Wait(first->id()).ok());

  auto all = client_->List();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->jobs_size(), 3);
  auto succeeded = client_->List({v1::SUCCEEDED});
  ASSERT_TRUE(succeeded.ok());
  EXPECT_EQ(succeeded->jobs_size(), 2);
  auto page = client_->List({}, 1);
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->jobs_size(), 1);
  EXPECT_FALSE(page->next_page_token().empty());

  EXPECT_EQ(client_->Get("no-such-job").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Cancel("no-such-job").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Wait("no-such-job").status().code(), absl::StatusCode::kNotFound);
  auto health = client_->Health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "SERVING");
}

TEST_F(ClientTest, WatchDeliversEveryEventOnceInOrder) {
  const std::string model_id = Upload();
  auto job = client_->Submit(NpyJob(model_id));
  ASSERT_TRUE(job.ok());
  std::vector<v1::JobEvent> events;
  auto done = client_->Watch(job->id(), [&](const v1::JobEvent& e) { events.push_back(e); });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->state(), v1::SUCCEEDED);
  ASSERT_GE(events.size(), 4u);
  EXPECT_TRUE(events[0].has_snapshot());
  for (size_t i = 1; i < events.size(); ++i) EXPECT_EQ(events[i].seq(), static_cast<int64_t>(i));
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED);
  EXPECT_TRUE(events[events.size() - 2].has_summary());

  // Watching an ended job from its last seq: just the snapshot.
  std::vector<v1::JobEvent> late;
  auto again = client_->Watch(
      job->id(), [&](const v1::JobEvent& e) { late.push_back(e); }, events.back().seq());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->state(), v1::SUCCEEDED);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_TRUE(late[0].has_snapshot());
}

TEST_F(ClientTest, DownloadsAtomicallyAndVerified) {
  const std::string model_id = Upload();
  auto job = client_->Submit(NpyJob(model_id));
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(client_->Wait(job->id())->state(), v1::SUCCEEDED);
  const std::string bn = tmp_.File("bn.safetensors");
  int64_t last_done = 0, last_total = 0;
  auto downloaded = client_->Download(job->id(), v1::BN_BUFFERS, bn, [&](int64_t done, int64_t total) {
    last_done = done;
    last_total = total;
  });
  ASSERT_TRUE(downloaded.ok()) << downloaded.status();
  EXPECT_EQ(downloaded->sha256, *Sha256OfFile(bn));
  EXPECT_EQ(downloaded->size, static_cast<int64_t>(fs::file_size(bn)));
  EXPECT_EQ(last_done, downloaded->size);
  EXPECT_EQ(last_total, downloaded->size);
  EXPECT_LE(WorstBnError(bn), 1e-5);
  auto report = client_->Download(job->id(), v1::REPORT, tmp_.File("report.json"));
  ASSERT_TRUE(report.ok());
  EXPECT_THAT(ReadBytes(tmp_.File("report.json")), HasSubstr("\"layers_recalibrated\": 20"));

  // Nothing to download from a job that did not succeed: no file, no temporary litter.
  auto failed = client_->Submit(NpyJob(model_id, "data/bn1d_2d.npy"));
  ASSERT_TRUE(failed.ok());
  ASSERT_EQ(client_->Wait(failed->id())->state(), v1::FAILED);
  fs::create_directories(tmp_.File("out"));
  auto refused = client_->Download(failed->id(), v1::MODEL, tmp_.File("out/model.pt"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fs::is_empty(tmp_.File("out")));
}

TEST_F(ClientTest, RecalibrateDoesItAllInOneCall) {
  RecalibrateOptions options;
  options.job.set_batch_size(8);
  options.bn_out = tmp_.File("bn.safetensors");
  options.report_out = tmp_.File("report.json");
  std::set<int> phases;
  auto result = client_->Recalibrate(kModel, "npy:data/resnet18.npy", options, tmp_.File("out.pt"),
                                     [&](const Progress& p) { phases.insert(static_cast<int>(p.phase)); });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->job.state(), v1::SUCCEEDED);
  EXPECT_FALSE(result->upload.already_present);
  ASSERT_EQ(result->downloads.size(), 3u);
  EXPECT_EQ(result->downloads[0].sha256, *Sha256OfFile(tmp_.File("out.pt")));
  EXPECT_LE(WorstBnError(options.bn_out), 1e-5);
  EXPECT_EQ(phases, (std::set<int>{static_cast<int>(Progress::Phase::kUpload),
                                   static_cast<int>(Progress::Phase::kJob),
                                   static_cast<int>(Progress::Phase::kDownload)}));

  // A job that fails comes back as an error carrying the job; nothing is written.
  auto failed = client_->Recalibrate(kModel, "npy:data/bn1d_2d.npy", options, tmp_.File("failed.pt"));
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("forward failed"));
  std::optional<v1::Job> job = JobOfError(failed.status());
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_FALSE(fs::exists(tmp_.File("failed.pt")));
  EXPECT_EQ(client_->Recalibrate(kModel, "bogus:x", options, tmp_.File("x.pt")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->Recalibrate(kModel, "npy:data/none.npy", options, tmp_.File("x.pt")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, RecalibrateStreamsLocalData) {
  // A copy outside every data root: only the client can read it.
  const std::string local = tmp_.File("local.npy");
  fs::copy_file(kFixtures + "/data/resnet18.npy", local);
  RecalibrateOptions options;
  options.job.set_batch_size(8);
  options.stream = true;
  options.bn_out = tmp_.File("bn.safetensors");
  int64_t pushed = 0;
  auto result =
      client_->Recalibrate(kModel, "npy:" + local, options, tmp_.File("out.pt"), [&](const Progress& p) {
        if (p.phase == Progress::Phase::kPush) pushed = p.done;
      });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(pushed, 3);
  EXPECT_TRUE(result->job.spec().data().has_client_stream());
  EXPECT_LE(WorstBnError(options.bn_out), 1e-5);
}

TEST_F(ClientTest, RecalibratesOnImageFoldersNamedBySpecs) {
  ASSERT_EQ(MakeImageFolders(tmp_.path()), 0);
  const std::string transform = "?resize=36&crop=32&mean=0.485,0.456,0.406&std=0.229,0.224,0.225";
  RecalibrateOptions options;
  options.job.set_batch_size(3);
  auto result = client_->Recalibrate(kModel, "images:imgs" + transform, options, tmp_.File("out.pt"));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->job.state(), v1::SUCCEEDED);
  EXPECT_EQ(result->job.progress().samples_done(), kImageFolderImages);
  EXPECT_EQ(result->job.spec().data().image_folder().crop(), 32);
  EXPECT_EQ(DataSourceToSpec(result->job.spec().data()), "images:imgs" + transform);
  auto report_of = [&](const std::string& job_id) {
    const std::string path = tmp_.File(job_id + ".report.json");
    EXPECT_TRUE(client_->Download(job_id, v1::REPORT, path).ok());
    v1::RunReport report;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(ReadBytes(path), &report).ok());
    return report;
  };
  const v1::RunReport report = report_of(result->job.id());
  EXPECT_EQ(report.samples(), kImageFolderImages);
  EXPECT_EQ(report.batches(), 2);

  const std::string model_id = result->job.spec().model_id();
  auto submit = [&](const std::string& spec) -> absl::StatusOr<v1::Job> {
    v1::JobSpec job;
    job.set_model_id(model_id);
    job.set_batch_size(3);
    RECAL_ASSIGN_OR_RETURN(*job.mutable_data(), DataSourceFromSpec(spec));
    return client_->Submit(job);
  };
  EXPECT_EQ(submit("images:" + tmp_.File("outside/imgs") + transform).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto fails = submit("images:with_bad" + transform + "&on_bad=fail");
  ASSERT_TRUE(fails.ok()) << fails.status();
  auto failed = client_->Wait(fails->id());
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->state(), v1::FAILED);
  EXPECT_THAT(failed->error().message(), HasSubstr("x.jpg"));
  auto skips = submit("images:with_bad" + transform + "&on_bad=skip");
  ASSERT_TRUE(skips.ok()) << skips.status();
  auto skipped = client_->Wait(skips->id());
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(skipped->state(), v1::SUCCEEDED) << skipped->error().message();
  EXPECT_EQ(skipped->progress().samples_done(), kImageFolderImages);
  EXPECT_EQ(report_of(skips->id()).samples(), kImageFolderImages);
  EXPECT_EQ(report_of(skips->id()).skipped_files(), 1);
}

class OneWorkerClientTest : public ClientTest {
 protected:
  ClientOptions Options() override {
    ClientOptions options;
    options.reconnect_timeout = absl::Seconds(60);
    return options;
  }
};

TEST_F(OneWorkerClientTest, WatchResumesAcrossAServerRestart) {
  const std::string model_id = Upload();
  auto job = client_->Submit(LongJob(model_id, 24));
  ASSERT_TRUE(job.ok());
  std::mutex mu;
  std::vector<v1::JobEvent> events;
  std::atomic<bool> running{false};
  absl::StatusOr<v1::Job> final_job;
  std::thread watcher([&] {
    final_job = client_->Watch(job->id(), [&](const v1::JobEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
      if (e.has_progress()) running = true;
    });
  });
  for (int i = 0; i < 600 && !running; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(running) << "the job never made progress";
  RestartOnSamePort();
  watcher.join();

  ASSERT_TRUE(final_job.ok()) << final_job.status();
  EXPECT_EQ(final_job->state(), v1::SUCCEEDED);
  EXPECT_EQ(final_job->attempts(), 2);  // it ran again after the restart
  int snapshots = 0;
  int64_t last = 0;
  for (const v1::JobEvent& e : events) {
    if (e.has_snapshot()) {
      ++snapshots;
      EXPECT_EQ(e.seq(), last) << "a reconnection resumes from the last seq seen";
      continue;
    }
    EXPECT_EQ(e.seq(), last + 1) << "no event is lost or repeated";
    last = e.seq();
  }
  EXPECT_GE(snapshots, 2) << "the watch reconnected";
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED);
}

// The library against the real server over mutual TLS (certificates made at test time),
// with a bearer token on top: the whole path from upload to verified download.
class MutualTlsClientTest : public ClientTest {
 protected:
  std::vector<std::string> Flags() override {
    certs_ = tmp_.File("certs");
    EXPECT_EQ(std::system(("bash " RECAL_MAKE_TEST_CERTS " " + certs_).c_str()), 0);
    std::vector<std::string> flags = ClientTest::Flags();
    flags.push_back("--tls_cert=" + certs_ + "/server.pem");
    flags.push_back("--tls_key=" + certs_ + "/server.key");
    flags.push_back("--tls_client_ca=" + certs_ + "/ca.pem");
    return flags;
  }
  ClientOptions Options() override {
    ClientOptions options;
    options.tls_root_certs_file = certs_ + "/ca.pem";
    options.tls_client_cert_file = certs_ + "/client.pem";
    options.tls_client_key_file = certs_ + "/client.key";
    return options;
  }
  std::string certs_;
};

TEST_F(MutualTlsClientTest, RecalibratesOverMutualTls) {
  const std::string model_id = Upload();
  auto job = client_->Submit(NpyJob(model_id));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(client_->Wait(job->id())->state(), v1::SUCCEEDED);
  const std::string bn = tmp_.File("bn.safetensors");
  ASSERT_TRUE(client_->Download(job->id(), v1::BN_BUFFERS, bn).ok());
  EXPECT_LE(WorstBnError(bn), 1e-5);
  // The same client without its certificate does not get a connection.
  ClientOptions no_cert;
  no_cert.tls_root_certs_file = certs_ + "/ca.pem";
  no_cert.bearer_token = server_->token();
  no_cert.retry.max_attempts = 1;
  auto anonymous = Client::Connect(target(), no_cert);
  ASSERT_TRUE(anonymous.ok());
  EXPECT_EQ((*anonymous)->Get(job->id()).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace recal::testing
