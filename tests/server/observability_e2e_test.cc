// recal-server's metrics and logs, end to end: the real binary scraped over HTTP at
// /metrics while a job runs and after jobs succeeded, failed and were cancelled; and its
// JSON log lines, parsed one by one.
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/sha256.h"
#include "tests/server/calls.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

using ::testing::HasSubstr;

const std::string kFixtures = RECAL_FIXTURES_DIR;
const std::string kModel = kFixtures + "/models/resnet18.traced_eval.pt";

// The Prometheus text format: families by "# TYPE" and samples with their labels.
struct Exposition {
  struct Sample {
    std::string name;
    std::map<std::string, std::string> labels;
    double value = 0;
  };
  std::map<std::string, std::string> types;  // family -> counter | gauge | histogram
  std::vector<Sample> samples;
  std::string text;

  explicit Exposition(const std::string& body) : text(body) {
    std::istringstream lines(body);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("# TYPE ", 0) == 0) {
        std::istringstream words(line.substr(7));
        std::string name, type;
        words >> name >> type;
        types[name] = type;
        continue;
      }
      if (line.empty() || line[0] == '#') continue;
      Sample sample;
      const size_t space = line.rfind(' ');
      const std::string series = line.substr(0, space);
      sample.value = std::strtod(line.c_str() + space + 1, nullptr);
      const size_t brace = series.find('{');
      sample.name = series.substr(0, brace);
      if (brace != std::string::npos) {
        std::string labels = series.substr(brace + 1, series.size() - brace - 2);
        size_t at = 0;
        while (at < labels.size()) {
          const size_t eq = labels.find("=\"", at);
          const size_t close = labels.find('"', eq + 2);
          sample.labels[labels.substr(at, eq - at)] = labels.substr(eq + 2, close - eq - 2);
          at = close + 2;  // past '",'
        }
      }
      samples.push_back(std::move(sample));
    }
  }

  // The sum over the samples named `name` whose labels include `labels`; -1 if there are none.
  double Value(const std::string& name, const std::map<std::string, std::string>& labels = {}) const {
    double sum = 0;
    bool found = false;
    for (const Sample& s : samples) {
      if (s.name != name) continue;
      bool match = true;
      for (const auto& [key, value] : labels) {
        auto it = s.labels.find(key);
        match = match && it != s.labels.end() && it->second == value;
      }
      if (match) {
        sum += s.value;
        found = true;
      }
    }
    return found ? sum : -1;
  }
};

std::map<std::string, std::string> Rpc(const std::string& method, const std::string& code = "") {
  std::map<std::string, std::string> labels = {{"grpc_service", "recal.v1.Recal"}, {"grpc_method", method}};
  if (!code.empty()) labels["grpc_code"] = code;
  return labels;
}

class ObservabilityTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> flags) {
    flags.push_back("--data_root=" + kFixtures);
    flags.push_back("--threads_per_worker=1");
    server_ = std::make_unique<ServerProcess>(tmp_.File("data"), flags);
    ASSERT_TRUE(server_->ok()) << server_->log();
    stub_ = server_->Stub();
  }
  std::string UploadModel() {
    const std::string bytes = ReadBytes(kModel);
    grpc::ClientContext context;
    v1::Model model;
    auto writer = stub_->UploadModel(&context, &model);
    v1::UploadModelRequest header;
    header.mutable_header()->set_name("resnet18");
    header.mutable_header()->set_size(bytes.size());
    header.mutable_header()->set_sha256(Sha256Hex(bytes));
    writer->Write(header);
    const int64_t chunk = 1 << 20;
    for (int64_t offset = 0; offset < static_cast<int64_t>(bytes.size()); offset += chunk) {
      v1::UploadModelRequest part;
      part.mutable_chunk()->set_offset(offset);
      part.mutable_chunk()->set_data(bytes.substr(offset, chunk));
      writer->Write(part);
    }
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return model.id();
  }
  v1::Job Submit(const std::string& model_id, const std::string& npy) {
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_model_id(model_id);
    request.mutable_spec()->set_batch_size(npy.empty() ? 32 : 8);
    if (npy.empty()) {  // 200 synthetic batches of 32x3x96x96: runs until cancelled
      for (int64_t d : {3, 96, 96}) request.mutable_spec()->mutable_data()->mutable_synthetic()->add_sample_shape(d);
    } else {
      request.mutable_spec()->mutable_data()->mutable_tensor_file()->set_format(v1::TensorFileSource::NPY);
      request.mutable_spec()->mutable_data()->mutable_tensor_file()->set_path(npy);
    }
    grpc::ClientContext context;
    v1::Job job;
    grpc::Status status = stub_->SubmitJob(&context, request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }
  v1::Job WaitFor(const std::string& id, const std::function<bool(const v1::Job&)>& done, double seconds = 60) {
    return PollJob(*stub_, id, done, seconds);
  }
  v1::Job WaitForState(const std::string& id, v1::JobState state) {
    return WaitFor(id, [state](const v1::Job& job) { return job.state() == state; });
  }
  grpc::Status Download(const std::string& id, std::string* bytes) {
    grpc::ClientContext context;
    v1::DownloadResultRequest request;
    request.set_job_id(id);
    request.set_artifact(v1::BN_BUFFERS);
    auto reader = stub_->DownloadResult(&context, request);
    v1::DownloadResultChunk chunk;
    while (reader->Read(&chunk)) *bytes += chunk.data();
    return reader->Finish();
  }
  void Cancel(const std::string& id) {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_id(id);
    v1::Job job;
    EXPECT_TRUE(stub_->CancelJob(&context, request, &job).ok());
  }
  // Scrapes until `ready` holds (or 10 s pass) and returns the last scrape.
  Exposition ScrapeUntil(const std::function<bool(const Exposition&)>& ready) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (true) {
      Exposition metrics(ScrapeMetrics(server_->metrics_port()));
      if (ready(metrics) || std::chrono::steady_clock::now() > deadline) return metrics;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  TempDir tmp_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Recal::Stub> stub_;
};

TEST_F(ObservabilityTest, MetricsCountCallsJobsBatchesAndBytes) {
  Start({"--metrics_listen=127.0.0.1:0"});
  ASSERT_GT(server_->metrics_port(), 0) << server_->log();
  const int64_t model_size = std::filesystem::file_size(kModel);
  const std::string model_id = UploadModel();

  const v1::Job failing = Submit(model_id, "data/bn1d_2d.npy");  // data that does not fit the model
  WaitForState(failing.id(), v1::FAILED);
  const v1::Job good = Submit(model_id, "data/resnet18.npy");
  WaitForState(good.id(), v1::SUCCEEDED);
  std::string bn;
  ASSERT_TRUE(Download(good.id(), &bn).ok());
  std::string none;
  EXPECT_EQ(Download(failing.id(), &none).error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  // While a job runs, with a watcher on it.
  const v1::Job running = Submit(model_id, "");
  WaitFor(running.id(), [](const v1::Job& job) { return job.state() == v1::RUNNING && job.progress().batches_done() > 0; });
  std::thread watcher([&] {
    grpc::ClientContext context;
    v1::WatchJobRequest request;
    request.set_id(running.id());
    auto reader = stub_->WatchJob(&context, request);
    v1::JobEvent event;
    while (reader->Read(&event)) {
    }
    reader->Finish();
  });
  Exposition during = ScrapeUntil([](const Exposition& m) { return m.Value("recal_watch_streams") == 1; });
  ASSERT_FALSE(during.text.empty()) << server_->log();
  for (const char* family :
       {"grpc_server_started_total", "grpc_server_handled_total", "grpc_server_handling_seconds",
        "recal_jobs_submitted_total", "recal_jobs_finished_total", "recal_jobs_queued", "recal_jobs_running",
        "recal_job_queue_wait_seconds", "recal_job_duration_seconds", "recal_batches_processed_total",
        "recal_samples_processed_total", "recal_upload_bytes_total", "recal_download_bytes_total",
        "recal_store_bytes", "recal_worker_busy", "recal_watch_streams", "recal_build_info",
        "recal_disk_free_bytes", "recal_min_free_disk_bytes"}) {
    EXPECT_TRUE(during.types.count(family)) << family << " missing from\n" << during.text;
  }
  // The disk uploads are staged on, and the floor they keep free (--min_free_disk_bytes).
  EXPECT_GT(during.Value("recal_disk_free_bytes"), 0);
  EXPECT_EQ(during.Value("recal_min_free_disk_bytes"), double(int64_t{1} << 30));
  EXPECT_EQ(during.types["grpc_server_handled_total"], "counter");
  EXPECT_EQ(during.types["grpc_server_handling_seconds"], "histogram");
  EXPECT_EQ(during.types["recal_jobs_running"], "gauge");
  EXPECT_EQ(during.Value("recal_jobs_running"), 1);
  EXPECT_EQ(during.Value("recal_jobs_queued"), 0);
  EXPECT_EQ(during.Value("recal_worker_busy", {{"device", "cpu"}}), 1);
  EXPECT_EQ(during.Value("recal_watch_streams"), 1);
  EXPECT_GT(during.Value("recal_batches_processed_total"), 0);
  EXPECT_EQ(during.Value("recal_build_info"), 1);

  // The counter goes on while the job runs (cancelling stops its worker mid-batch).
  const double batches_during = during.Value("recal_batches_processed_total");
  Exposition later = ScrapeUntil(
      [&](const Exposition& m) { return m.Value("recal_batches_processed_total") > batches_during; });
  Cancel(running.id());
  WaitForState(running.id(), v1::CANCELLED);
  watcher.join();

  Exposition after = ScrapeUntil([](const Exposition& m) { return m.Value("recal_watch_streams") == 0; });
  EXPECT_EQ(after.Value("recal_jobs_submitted_total"), 3);
  EXPECT_EQ(after.Value("recal_jobs_finished_total", {{"state", "SUCCEEDED"}}), 1);
  EXPECT_EQ(after.Value("recal_jobs_finished_total", {{"state", "FAILED"}}), 1);
  EXPECT_EQ(after.Value("recal_jobs_finished_total", {{"state", "CANCELLED"}}), 1);
  EXPECT_EQ(after.Value("recal_jobs_running"), 0);
  EXPECT_EQ(after.Value("recal_worker_busy", {{"device", "cpu"}}), 0);
  EXPECT_EQ(after.Value("recal_watch_streams"), 0);
  EXPECT_EQ(after.Value("recal_job_queue_wait_seconds_count"), 3);
  EXPECT_EQ(after.Value("recal_job_duration_seconds_count"), 3);
  EXPECT_GE(after.Value("recal_job_duration_seconds_sum"), 0);
  EXPECT_GT(later.Value("recal_batches_processed_total"), batches_during);
  EXPECT_GE(after.Value("recal_batches_processed_total"), later.Value("recal_batches_processed_total"));
  EXPECT_GT(after.Value("recal_samples_processed_total"), after.Value("recal_batches_processed_total"));
  EXPECT_GE(after.Value("recal_upload_bytes_total"), model_size);
  EXPECT_GE(after.Value("recal_download_bytes_total"), static_cast<double>(bn.size()));
  EXPECT_GT(bn.size(), 0u);
  // Per tenant, what its quota counts: models and results, and unfinished uploads with their
  // whole declared size from their start (1000 of 2000 bytes sent, then the upload abandoned).
  const double stored = after.Value("recal_store_bytes", {{"tenant", "default"}});
  EXPECT_GE(stored, model_size);
  {
    const std::string bytes(2000, 'p');
    grpc::ClientContext context;
    v1::Model model;
    auto writer = stub_->UploadModel(&context, &model);
    v1::UploadModelRequest header;
    header.mutable_header()->set_size(2000);
    header.mutable_header()->set_sha256(Sha256Hex(bytes));
    writer->Write(header);
    v1::UploadModelRequest part;
    part.mutable_chunk()->set_data(bytes.substr(0, 1000));
    writer->Write(part);
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);  // incomplete
  }
  Exposition partial = ScrapeUntil(
      [&](const Exposition& m) { return m.Value("recal_store_bytes", {{"tenant", "default"}}) != stored; });
  EXPECT_EQ(partial.Value("recal_store_bytes", {{"tenant", "default"}}), stored + 2000);
  EXPECT_EQ(after.Value("grpc_server_started_total", Rpc("SubmitJob")), 3);
  EXPECT_EQ(after.Value("grpc_server_handled_total", Rpc("SubmitJob", "OK")), 3);
  EXPECT_EQ(after.Value("grpc_server_handled_total", Rpc("UploadModel", "OK")), 1);
  EXPECT_EQ(after.Value("grpc_server_handled_total", Rpc("DownloadResult", "FAILED_PRECONDITION")), 1);
  EXPECT_EQ(after.Value("grpc_server_handling_seconds_count", Rpc("SubmitJob")), 3);
  EXPECT_EQ(after.Value("grpc_server_handled_total", Rpc("WatchJob", "OK")), 1);

  // The failed call is in the log with its method and peer; every job line names its job.
  const std::string log = server_->log();
  EXPECT_THAT(log, HasSubstr("call failed method=/recal.v1.Recal/DownloadResult peer=ipv4:127.0.0.1:"));
  EXPECT_THAT(log, HasSubstr("code=FAILED_PRECONDITION"));
  EXPECT_THAT(log, HasSubstr("job finished job_id=" + failing.id() + " state=FAILED"));
  EXPECT_THAT(log, HasSubstr("job finished job_id=" + running.id() + " state=CANCELLED"));
  EXPECT_THAT(log, HasSubstr("job started job_id=" + good.id()));
  EXPECT_EQ(log.find("batch_done"), std::string::npos);
}

// Watchers that go away while they wait on a job (a call cancelled, a deadline passed) are
// counted out at once: the gauge of watch streams returns to 0 with the job still waiting,
// and the job can still be watched to its end.
TEST_F(ObservabilityTest, WatchersThatGoAwayMidWaitLeaveTheWatchGaugeAtZero) {
  Start({"--metrics_listen=127.0.0.1:0"});
  ASSERT_GT(server_->metrics_port(), 0) << server_->log();
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id(UploadModel());
  request.mutable_spec()->set_batch_size(8);
  request.mutable_spec()->mutable_data()->mutable_client_stream();  // waits for pushes that never come
  grpc::ClientContext submit_context;
  v1::Job job;
  ASSERT_TRUE(stub_->SubmitJob(&submit_context, request, &job).ok());

  constexpr int kCancelled = 10, kTimedOut = 10;
  std::atomic<int> waiting{0};
  std::atomic<bool> go_away{false};
  std::vector<grpc::StatusCode> ended(kCancelled + kTimedOut, grpc::StatusCode::OK);
  std::vector<std::thread> watchers;
  for (int i = 0; i < kCancelled + kTimedOut; ++i) {
    watchers.emplace_back([&, i] {
      const bool timed = i >= kCancelled;
      grpc::ClientContext context;
      if (timed) context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      v1::WatchJobRequest watch;
      watch.set_id(job.id());
      auto reader = stub_->WatchJob(&context, watch);
      v1::JobEvent snapshot;
      if (reader->Read(&snapshot)) waiting.fetch_add(1);
      if (!timed) {
        while (!go_away.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        context.TryCancel();
      }
      v1::JobEvent event;
      while (reader->Read(&event)) {
      }
      ended[i] = reader->Finish().error_code();
    });
  }
  Exposition during = ScrapeUntil([&](const Exposition& m) {
    return waiting.load() == kCancelled + kTimedOut && m.Value("recal_watch_streams") == kCancelled + kTimedOut;
  });
  EXPECT_EQ(during.Value("recal_watch_streams"), kCancelled + kTimedOut);
  go_away.store(true);
  for (std::thread& watcher : watchers) watcher.join();
  for (int i = 0; i < kCancelled + kTimedOut; ++i) {
    EXPECT_EQ(ended[i], i < kCancelled ? grpc::StatusCode::CANCELLED : grpc::StatusCode::DEADLINE_EXCEEDED) << i;
  }
  Exposition after = ScrapeUntil([](const Exposition& m) { return m.Value("recal_watch_streams") == 0; });
  EXPECT_EQ(after.Value("recal_watch_streams"), 0);
  // The job still waits for its batches.
  EXPECT_THAT(WaitFor(job.id(), [](const v1::Job&) { return true; }).state(),
              ::testing::AnyOf(v1::QUEUED, v1::RUNNING));

  std::vector<v1::JobEvent> to_the_end;
  grpc::Status watched;
  std::thread last([&] { to_the_end = Watch(*stub_, job.id(), 0, 100000, &watched); });
  ScrapeUntil([](const Exposition& m) { return m.Value("recal_watch_streams") == 1; });
  Cancel(job.id());
  last.join();
  EXPECT_TRUE(watched.ok()) << watched.error_message();
  ASSERT_FALSE(to_the_end.empty());
  EXPECT_EQ(to_the_end.back().state(), v1::CANCELLED);
  EXPECT_EQ(ScrapeUntil([](const Exposition& m) { return m.Value("recal_watch_streams") == 0; })
                .Value("recal_watch_streams"),
            0);
}

TEST_F(ObservabilityTest, ALookupThatFindsNothingIsInfoAndOtherFailuresWarnings) {
  Start({"--log_format=json"});
  {  // what every client asks before an upload: are these bytes stored?
    grpc::ClientContext context;
    v1::GetModelRequest request;
    request.set_id("sha256:" + std::string(64, 'a'));
    v1::Model model;
    EXPECT_EQ(stub_->GetModel(&context, request, &model).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  std::string none;
  EXPECT_EQ(Download("job-0000000000000000", &none).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(server_->Terminate(20), 0) << server_->log();
  std::map<std::string, std::string> level_of;  // method -> level of its "call failed" line
  std::istringstream lines(server_->log());
  for (std::string line; std::getline(lines, line);) {
    google::protobuf::Struct object;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &object).ok()) << line;
    const auto& fields = object.fields();
    if (fields.at("msg").string_value() != "call failed") continue;
    level_of[fields.at("method").string_value()] = fields.at("level").string_value();
  }
  EXPECT_EQ(level_of["/recal.v1.Recal/GetModel"], "info") << server_->log();
  EXPECT_EQ(level_of["/recal.v1.Recal/DownloadResult"], "warning") << server_->log();
}

TEST_F(ObservabilityTest, MetricsCanBeTurnedOff) {
  Start({"--metrics_listen="});
  EXPECT_EQ(server_->metrics_port(), 0);
  EXPECT_EQ(server_->Terminate(20), 0) << server_->log();
}

TEST_F(ObservabilityTest, JsonLogsAreOneObjectPerLineWithTheJobId) {
  Start({"--log_format=json"});
  const std::string model_id = UploadModel();
  const v1::Job failing = Submit(model_id, "data/bn1d_2d.npy");
  WaitForState(failing.id(), v1::FAILED);
  std::string none;
  EXPECT_EQ(Download(failing.id(), &none).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(server_->Terminate(20), 0) << server_->log();

  std::istringstream lines(server_->log());
  std::string line;
  std::vector<std::string> messages;
  while (std::getline(lines, line)) {
    google::protobuf::Struct object;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &object).ok()) << line;
    const auto& fields = object.fields();
    ASSERT_TRUE(fields.count("time") && fields.count("level") && fields.count("msg")) << line;
    EXPECT_THAT(fields.at("time").string_value(), ::testing::MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T.*Z"));
    const std::string msg = fields.at("msg").string_value();
    messages.push_back(msg);
    if (msg.rfind("job ", 0) == 0) {
      ASSERT_TRUE(fields.count("job_id")) << line;
      EXPECT_EQ(fields.at("job_id").string_value(), failing.id()) << line;
    }
    if (msg == "job finished") {
      EXPECT_EQ(fields.at("state").string_value(), "FAILED") << line;
      EXPECT_EQ(fields.at("level").string_value(), "warning") << line;
      EXPECT_GE(fields.at("duration_seconds").number_value(), 0) << line;
      EXPECT_THAT(fields.at("error").string_value(), HasSubstr("forward failed")) << line;
    }
    if (msg == "call failed") {
      EXPECT_EQ(fields.at("method").string_value(), "/recal.v1.Recal/DownloadResult") << line;
      EXPECT_THAT(fields.at("peer").string_value(), HasSubstr("127.0.0.1")) << line;
      EXPECT_EQ(fields.at("code").string_value(), "FAILED_PRECONDITION") << line;
    }
  }
  for (const char* expected : {"job submitted", "job started", "job finished", "call failed",
                               "recal-server: shutting down", "recal-server: stopped"}) {
    EXPECT_THAT(messages, ::testing::Contains(std::string(expected))) << server_->log();
  }
  EXPECT_THAT(messages, ::testing::Contains(::testing::StartsWith("recal-server: listening on port ")));
}

}  // namespace
}  // namespace recal::testing
