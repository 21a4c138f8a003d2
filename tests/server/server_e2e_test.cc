// recal-server end to end, as a client sees it: the real binary on a loopback port, real
// fixture models and files, results checked against the float64 reference.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <grpcpp/health_check_service_interface.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "google/protobuf/util/json_util.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/data/batch_source.h"
#include "recal/batch_parts.h"
#include "tests/engine/test_util.h"
#include "tests/server/calls.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const std::string kFixtures = RECAL_FIXTURES_DIR;
const std::string kModel = kFixtures + "/models/resnet18.traced_eval.pt";

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_dir_ = tmp_.File("data");
    fs::create_directories(own_root());
    server_ = std::make_unique<ServerProcess>(data_dir_, Flags());
    ASSERT_TRUE(server_->ok()) << server_->log();
    stub_ = server_->Stub();
  }
  // A second root of the test's own, for files made on the spot.
  std::string own_root() { return tmp_.File("root"); }
  virtual std::vector<std::string> Flags() { return {"--data_root=" + kFixtures + "," + own_root()}; }
  void Restart(std::vector<std::string> flags = {}) {
    server_ = std::make_unique<ServerProcess>(data_dir_, flags.empty() ? Flags() : flags);
    ASSERT_TRUE(server_->ok()) << server_->log();
    stub_ = server_->Stub();
  }
  std::string UploadModel() {
    v1::Model model;
    grpc::Status status = Upload(*stub_, ReadBytes(kModel), &model);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return model.id();
  }
  v1::Job Submit(const v1::SubmitJobRequest& request, grpc::Status* status = nullptr) {
    grpc::ClientContext context;
    v1::Job job;
    grpc::Status s = stub_->SubmitJob(&context, request, &job);
    if (status) *status = s;
    else EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }
  v1::Job Cancel(const std::string& id) {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_id(id);
    v1::Job job;
    EXPECT_TRUE(stub_->CancelJob(&context, request, &job).ok());
    return job;
  }

  TempDir tmp_;
  std::string data_dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Recal::Stub> stub_;
};

TEST_F(ServerTest, RecalibratesAFixtureModelToTheFloat64Reference) {
  const std::string model_id = UploadModel();
  EXPECT_EQ(model_id, "sha256:" + *Sha256OfFile(kModel));
  v1::Job job = Submit(NpyJob(model_id, "data/resnet18.npy", 8));
  EXPECT_EQ(job.state(), v1::QUEUED);

  std::vector<v1::JobEvent> events = Watch(*stub_, job.id());
  ASSERT_GE(events.size(), 4u);
  EXPECT_TRUE(events.front().has_snapshot());
  std::vector<v1::JobState> states;
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq(), events[i - 1].seq() + 1) << "events are numbered without gaps";
    if (events[i].kind_case() == v1::JobEvent::kState) states.push_back(events[i].state());
  }
  EXPECT_THAT(states, ::testing::ElementsAre(v1::QUEUED, v1::RUNNING, v1::SUCCEEDED));
  EXPECT_TRUE(events[events.size() - 2].has_summary());
  EXPECT_EQ(events[events.size() - 2].summary().layers_recalibrated(), 20);

  grpc::Status status;
  const std::string bn = Download(*stub_, job.id(), v1::BN_BUFFERS, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string bn_path = tmp_.File("bn.safetensors");
  std::ofstream(bn_path, std::ios::binary) << bn;
  auto got = engine::testing::ReadSafetensors(bn_path);
  auto reference = engine::testing::ReadSafetensors(kFixtures + "/ref/resnet18.population.safetensors");
  ASSERT_EQ(got.size(), reference.size());
  EXPECT_LE(engine::testing::WorstRelativeError(got, reference), 1e-5);
  const std::string model = Download(*stub_, job.id(), v1::MODEL, &status);
  ASSERT_TRUE(status.ok());
  const std::string model_path = tmp_.File("out.pt");
  std::ofstream(model_path, std::ios::binary) << model;
  EXPECT_NO_THROW(torch::jit::load(model_path));
  const std::string report = Download(*stub_, job.id(), v1::REPORT, &status);
  EXPECT_THAT(report, HasSubstr("\"layers_recalibrated\": 20"));
  // Resuming a download from an offset gives the rest.
  EXPECT_EQ(Download(*stub_, job.id(), v1::MODEL, &status, 1000), model.substr(1000));
}

TEST_F(ServerTest, FoldedModelIsTheEvalModeModelFolded) {
  v1::Model model;
  ASSERT_TRUE(Upload(*stub_, ReadBytes(kFixtures + "/models/resnet18.exported_train.pt2"), &model).ok());
  v1::SubmitJobRequest request = NpyJob(model.id(), "data/resnet18.npy", 8);
  request.mutable_spec()->mutable_options()->set_fold_batch_norm(true);
  const v1::Job job = Submit(request);
  ASSERT_EQ(WaitForState(*stub_, job.id(), v1::SUCCEEDED).state(), v1::SUCCEEDED);
  grpc::Status status;
  WriteBytes(tmp_.File("out.pt2"), Download(*stub_, job.id(), v1::MODEL, &status));
  ASSERT_TRUE(status.ok()) << status.error_message();
  WriteBytes(tmp_.File("folded.pt2"), Download(*stub_, job.id(), v1::FOLDED, &status));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(Download(*stub_, job.id(), v1::REPORT, &status), HasSubstr("\"fold\""));
  // PyTorch runs both: the recalibrated program in eval mode, and the folded one.
  EXPECT_EQ(RunFixturesPython(R"(import torch
import exported_programs as ep
d = sys.argv[1]
folded = torch.export.load(d + '/folded.pt2')
assert not ep.bn_calls(folded.graph), 'BatchNorm left in the folded ResNet-18'
x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
want = ep.eval_module(torch.export.load(d + '/out.pt2'))(x)
got = folded.module()(x)
sys.exit(0 if ((got - want).abs().max() / want.abs().max()).item() < 1e-4 else 1)
)",
                              tmp_.path()),
            0);

  // A job that did not ask has no folded model, and says how to get one.
  const v1::Job plain = Submit(NpyJob(model.id(), "data/resnet18.npy", 8));
  ASSERT_EQ(WaitForState(*stub_, plain.id(), v1::SUCCEEDED).state(), v1::SUCCEEDED);
  Download(*stub_, plain.id(), v1::FOLDED, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("fold_batch_norm"));

  // TorchScript cannot be folded: refused at submit, before a worker is spent, saying what to
  // do instead; the server goes on.
  v1::SubmitJobRequest script = NpyJob(UploadModel(), "data/resnet18.npy", 8);
  script.mutable_spec()->mutable_options()->set_fold_batch_norm(true);
  grpc::ClientContext context;
  v1::Job refused;
  const grpc::Status submitted = stub_->SubmitJob(&context, script, &refused);
  EXPECT_EQ(submitted.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(submitted.error_message(), HasSubstr("is TorchScript"));
  EXPECT_THAT(submitted.error_message(), HasSubstr("torch.export.save"));
  UploadModel();
}

TEST_F(ServerTest, HostileModelsAreRefusedAtUploadNamingTheOperatorTensorOrLimit) {
  // hostile/: archives that do more than math. crafted/ (tests/fixtures/crafted_archives.py):
  // bn.weight cut to a 16-byte record (unchecked, a job returned the worker's heap in it, or
  // the worker crashed), a graph too large or too deep to compile.
  const std::string hostile = kFixtures + "/hostile/", crafted = std::string(RECAL_CRAFTED_DIR) + "/";
  for (const auto& [path, reason] : std::vector<std::pair<std::string, std::string>>{
           {hostile + "reads_file.pt", "aten::from_file"},
           {hostile + "writes_file.pt", "aten::save"},
           {hostile + "prints.pt", "prim::Print"},
           {hostile + "exploding_graph.pt", "nodes"},
           {crafted + "truncated_weight_200000.pt", "tensor 'bn.weight'"},
           {crafted + "truncated_weight_200000.pt2", "tensor 'bn.weight'"},
           {crafted + "wide_graph.pt", "max_graph_nodes"},
           {crafted + "nested_ifs.pt", "max_graph_depth"}}) {
    v1::Model model;
    grpc::Status status = Upload(*stub_, ReadBytes(path), &model);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << path << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(reason)) << path;
  }
  EXPECT_FALSE(fs::exists(kFixtures + "/hostile/written.pt"));
  UploadModel();  // the server goes on
}

TEST_F(ServerTest, EndlessModelEndsAtItsTimeoutOrOnCancelAndTheNextJobRuns) {
  // 32 samples of 4 features, what the hostile models take.
  std::vector<float> values(32 * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 7) - 3.0f;
  WriteBytes(own_root() + "/x4.npy",
             NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (32, 4), }", BytesOf(values)));
  v1::Model endless;
  ASSERT_TRUE(Upload(*stub_, ReadBytes(kFixtures + "/hostile/endless_loop.pt"), &endless).ok());
  v1::SubmitJobRequest request = NpyJob(endless.id(), own_root() + "/x4.npy", 8);
  request.mutable_spec()->set_timeout_seconds(1);
  auto start = std::chrono::steady_clock::now();
  const v1::Job timed_out = WaitForState(*stub_, Submit(request).id(), v1::FAILED, 30);
  EXPECT_THAT(timed_out.error().message(), HasSubstr("timeout of 1 s"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(8));

  request.mutable_spec()->set_timeout_seconds(0);
  const v1::Job running = Submit(request);
  WaitForState(*stub_, running.id(), v1::RUNNING, 30);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  start = std::chrono::steady_clock::now();
  Cancel(running.id());
  WaitForState(*stub_, running.id(), v1::CANCELLED, 30);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  const std::string good = UploadModel();
  WaitForState(*stub_, Submit(NpyJob(good, "data/resnet18.npy", 8)).id(), v1::SUCCEEDED);
}

TEST_F(ServerTest, UploadsAreContentAddressedVerifiedAndResumable) {
  const std::string bytes = ReadBytes(kModel);
  v1::Model first, second;
  // Broken off after 10 of ~45 chunks of 1 MiB...
  Upload(*stub_, bytes, &first, 0, 10 << 20, "", /*break_off=*/true);
  grpc::ClientContext context;
  v1::GetUploadStatusRequest request;
  request.set_sha256(Sha256Hex(bytes));
  v1::UploadStatus upload;
  ASSERT_TRUE(stub_->GetUploadStatus(&context, request, &upload).ok());
  EXPECT_EQ(upload.committed_size(), 10 << 20);
  // ... resumed from the committed size.
  ASSERT_TRUE(Upload(*stub_, bytes, &first, upload.committed_size()).ok());
  EXPECT_EQ(first.size(), static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(first.layers_size(), 20);
  // The same bytes again: the same model, nothing sent.
  ASSERT_TRUE(Upload(*stub_, bytes, &second, 0, 0).ok());
  EXPECT_EQ(second.id(), first.id());

  v1::Model refused;
  grpc::Status mismatch = Upload(*stub_, bytes.substr(0, 4096), &refused, 0, -1, std::string(64, 'a'));
  EXPECT_EQ(mismatch.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << mismatch.error_message();
  grpc::Status garbage = Upload(*stub_, std::string(5000, 'x'), &refused);
  EXPECT_EQ(garbage.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(garbage.error_message(), HasSubstr("model refused"));
  grpc::Status traversal = Upload(*stub_, bytes, &refused, 0, 0, "../../../etc/passwd");
  EXPECT_EQ(traversal.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Too large for --max_model_bytes (2 GiB by default): refused from the header alone.
  grpc::ClientContext context2;
  auto writer = stub_->UploadModel(&context2, &refused);
  v1::UploadModelRequest header;
  header.mutable_header()->set_size(int64_t{3} << 30);
  header.mutable_header()->set_sha256(std::string(64, 'b'));
  writer->Write(header);
  writer->WritesDone();
  grpc::Status oversize = writer->Finish();
  EXPECT_EQ(oversize.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(oversize.error_message(), HasSubstr("max_model_bytes"));
}

// Four clients upload the same bytes at once into the one partial upload their tenant has
// (every rank of a training job uploading its model): a chunk another client has just
// filled is taken for its new bytes only, the finishes are served one at a time, and a
// client told FAILED_PRECONDITION resumes from the committed size, as a real client does.
// All end with the same model, stored once and whole.
TEST_F(ServerTest, ConcurrentUploadsOfTheSameBytesEndInOneModel) {
  const std::string bytes = ReadBytes(kModel);
  const std::string hex = Sha256Hex(bytes);
  constexpr int kClients = 4;
  std::vector<std::string> ids(kClients), errors(kClients);
  std::vector<int> attempts(kClients, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      auto stub = server_->Stub();
      while (++attempts[i] <= 100) {
        grpc::ClientContext context;
        v1::GetUploadStatusRequest request;
        request.set_sha256(hex);
        v1::UploadStatus upload;
        grpc::Status status = stub->GetUploadStatus(&context, request, &upload);
        if (!status.ok()) {
          errors[i] = "GetUploadStatus: " + status.error_message();
          return;
        }
        v1::Model model;
        status = Upload(*stub, bytes, &model, upload.committed_size(), -1, "", false, 256 << 10);
        if (status.ok()) {
          ids[i] = model.id();
          return;
        }
        if (status.error_code() != grpc::StatusCode::FAILED_PRECONDITION) {
          errors[i] = "UploadModel: " + status.error_message();
          return;
        }
      }
      errors[i] = "not uploaded after 100 attempts";
    });
  }
  for (std::thread& client : clients) client.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(errors[i], "") << "client " << i;
    EXPECT_EQ(ids[i], ids[0]) << "client " << i;
  }
  ASSERT_FALSE(ids[0].empty());
  grpc::ClientContext context;
  v1::ListModelsRequest request;
  v1::ListModelsResponse models;
  ASSERT_TRUE(stub_->ListModels(&context, request, &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).id(), ids[0]);
  EXPECT_EQ(models.models(0).size(), static_cast<int64_t>(bytes.size()));
  EXPECT_EQ(models.models(0).layers_size(), 20);
  // Nothing is left half-uploaded, and the stored model runs.
  grpc::ClientContext status_context;
  v1::GetUploadStatusRequest status_request;
  status_request.set_sha256(hex);
  v1::UploadStatus upload;
  ASSERT_TRUE(stub_->GetUploadStatus(&status_context, status_request, &upload).ok());
  EXPECT_EQ(upload.model_id(), ids[0]);
  WaitForState(*stub_, Submit(NpyJob(ids[0], "data/resnet18.npy", 8)).id(), v1::SUCCEEDED);
}

TEST_F(ServerTest, BadSpecsAndPathsOutsideTheDataRootsAreRefused) {
  const std::string model_id = UploadModel();
  fs::create_symlink("/etc/passwd", own_root() + "/escape_link.npy");
  struct Case {
    v1::SubmitJobRequest request;
    grpc::StatusCode code;
  };
  std::vector<Case> cases = {
      {NpyJob(model_id, "../../etc/passwd", 8), grpc::StatusCode::PERMISSION_DENIED},
      {NpyJob(model_id, "/etc/passwd", 8), grpc::StatusCode::PERMISSION_DENIED},
      {NpyJob(model_id, own_root() + "/escape_link.npy", 8), grpc::StatusCode::PERMISSION_DENIED},
      {NpyJob(model_id, "data/no_such_file.npy", 8), grpc::StatusCode::NOT_FOUND},
      {NpyJob(model_id, "data/resnet18.npy", 0), grpc::StatusCode::INVALID_ARGUMENT},
      {NpyJob("sha256:" + std::string(64, '0'), "data/resnet18.npy", 8), grpc::StatusCode::NOT_FOUND},
      {NpyJob("not-an-id", "data/resnet18.npy", 8), grpc::StatusCode::NOT_FOUND},  // a name nobody has
      {NpyJob("sha256:not-hex", "data/resnet18.npy", 8), grpc::StatusCode::INVALID_ARGUMENT},
      {NpyJob("resnet18:0", "data/resnet18.npy", 8), grpc::StatusCode::INVALID_ARGUMENT},
  };
  for (const Case& c : cases) {
    grpc::Status status;
    Submit(c.request, &status);
    EXPECT_EQ(status.error_code(), c.code) << c.request.ShortDebugString() << ": " << status.error_message();
  }
  // A job whose data does not fit the model fails with the engine's reason; the server lives on.
  v1::Job bad = Submit(NpyJob(model_id, "data/bn1d_2d.npy", 8));
  v1::Job failed = WaitForState(*stub_, bad.id(), v1::FAILED);
  EXPECT_THAT(failed.error().message(), HasSubstr("forward failed on batch 0"));
  v1::Job good = Submit(NpyJob(model_id, "data/resnet18.npy", 8));
  WaitForState(*stub_, good.id(), v1::SUCCEEDED);
  grpc::Status status;
  Download(*stub_, bad.id(), v1::MODEL, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ServerTest, SubmitIsIdempotentOnRequestId) {
  const std::string model_id = UploadModel();
  v1::SubmitJobRequest request = NpyJob(model_id, "data/resnet18.npy", 8);
  request.set_request_id("retry-me");
  v1::Job first = Submit(request);
  v1::Job again = Submit(request);
  EXPECT_EQ(first.id(), again.id());
  grpc::ClientContext context;
  v1::ListJobsResponse list;
  ASSERT_TRUE(stub_->ListJobs(&context, v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 1);
}

using engine::testing::ToProto;

TEST_F(ServerTest, LastBatchOfOneSampleCountsThroughFilesAndStreams) {
  // 33 samples at batch size 8: in the last batch BatchNorm1d on (N, C) and on (N, C, 1)
  // sees one value per channel. Files and pushed batches, both estimators, give the float64
  // reference; the report counts the call that has no variance.
  v1::Model model;
  ASSERT_TRUE(Upload(*stub_, ReadBytes(kFixtures + "/models/last_single_1d.traced_train.pt"), &model).ok());
  auto source = data::OpenBatchSource(
      "safetensors:" + kFixtures + "/data/last_single_1d.safetensors:seq,vec", 8);
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<std::vector<at::Tensor>> batches;
  while (true) {
    auto batch = (*source)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (!*batch) break;
    batches.push_back(**batch);
  }
  ASSERT_EQ(batches.back()[0].size(0), 1);

  for (v1::Estimator estimator : {v1::POPULATION, v1::BATCH_AVERAGE}) {
    const std::string name = v1::Estimator_Name(estimator);
    v1::SubmitJobRequest files;
    files.mutable_spec()->set_model_id(model.id());
    files.mutable_spec()->set_batch_size(8);
    files.mutable_spec()->mutable_options()->set_estimator(estimator);
    auto* file = files.mutable_spec()->mutable_data()->mutable_tensor_file();
    file->set_format(v1::TensorFileSource::SAFETENSORS);
    file->set_path("data/last_single_1d.safetensors");
    file->add_keys("seq");
    file->add_keys("vec");
    v1::SubmitJobRequest streamed = files;
    streamed.mutable_spec()->mutable_data()->mutable_client_stream();
    const v1::Job file_job = Submit(files);
    const v1::Job stream_job = Submit(streamed);

    grpc::ClientContext context;
    v1::PushBatchesResponse pushed;
    auto writer = stub_->PushBatches(&context, &pushed);
    for (const auto& batch : batches) {
      v1::PushBatchesRequest message;
      message.set_job_id(stream_job.id());
      for (const at::Tensor& input : batch) *message.add_inputs() = ToProto(input);
      ASSERT_TRUE(writer->Write(message));
    }
    v1::PushBatchesRequest last;
    last.set_job_id(stream_job.id());
    last.set_last(true);
    writer->Write(last);
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());

    const std::string reference_path = kFixtures + "/ref/last_single_1d." +
                                       (estimator == v1::POPULATION ? "population" : "batch_average") +
                                       ".safetensors";
    for (const v1::Job& job : {file_job, stream_job}) {
      WaitForState(*stub_, job.id(), v1::SUCCEEDED);
      const std::string path = tmp_.File(job.id() + ".safetensors");
      std::ofstream(path, std::ios::binary) << Download(*stub_, job.id(), v1::BN_BUFFERS);
      EXPECT_LE(engine::testing::WorstRelativeError(engine::testing::ReadSafetensors(path),
                                                    engine::testing::ReadSafetensors(reference_path)),
                1e-5) << name;
      v1::RunReport report;
      ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                      Download(*stub_, job.id(), v1::REPORT), &report).ok());
      std::map<std::string, int64_t> without_variance;
      for (const auto& layer : report.layers()) without_variance[layer.name()] = layer.calls_without_variance();
      EXPECT_EQ(without_variance, (std::map<std::string, int64_t>{{"bn_seq", 0}, {"bn_pooled", 1}, {"bn_vec", 1}}))
          << name;
    }
  }
}

TEST_F(ServerTest, ClientStreamedBatchesAreRecalibratedLikeFiles) {
  const std::string model_id = UploadModel();
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id(model_id);
  request.mutable_spec()->set_batch_size(8);
  request.mutable_spec()->mutable_data()->mutable_client_stream();
  v1::Job job = Submit(request);

  auto source = data::OpenBatchSource("npy:" + kFixtures + "/data/resnet18.npy", 8);
  ASSERT_TRUE(source.ok());
  grpc::ClientContext context;
  v1::PushBatchesResponse pushed;
  auto writer = stub_->PushBatches(&context, &pushed);
  while (true) {
    auto batch = (*source)->Next();
    ASSERT_TRUE(batch.ok());
    v1::PushBatchesRequest message;
    message.set_job_id(job.id());
    if (!*batch) {
      message.set_last(true);
      writer->Write(message);
      break;
    }
    *message.add_inputs() = ToProto((**batch)[0]);
    ASSERT_TRUE(writer->Write(message));
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(pushed.batches_received(), 3);
  WaitForState(*stub_, job.id(), v1::SUCCEEDED);
  const std::string bn_path = tmp_.File("bn.safetensors");
  std::ofstream(bn_path, std::ios::binary) << Download(*stub_, job.id(), v1::BN_BUFFERS);
  auto got = engine::testing::ReadSafetensors(bn_path);
  auto reference = engine::testing::ReadSafetensors(kFixtures + "/ref/resnet18.population.safetensors");
  EXPECT_LE(engine::testing::WorstRelativeError(got, reference), 1e-5);

  // Malformed pushes are refused with the reason; pushing to a file job is refused.
  v1::Job other = Submit(request);
  auto push_one = [&](const std::string& id, const v1::Tensor& tensor) {
    grpc::ClientContext push_context;
    v1::PushBatchesResponse response;
    auto push = stub_->PushBatches(&push_context, &response);
    v1::PushBatchesRequest message;
    message.set_job_id(id);
    *message.add_inputs() = tensor;
    push->Write(message);
    push->WritesDone();
    return push->Finish();
  };
  v1::Tensor short_data = ToProto(at::zeros({2, 3, 8, 8}));
  short_data.mutable_data()->resize(10);
  EXPECT_EQ(push_one(other.id(), short_data).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::Tensor huge;
  huge.set_dtype(v1::Tensor::FLOAT32);
  for (int64_t d : {1 << 20, 1 << 12}) huge.add_shape(d);
  grpc::Status too_big = push_one(other.id(), huge);
  EXPECT_EQ(too_big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(too_big.error_message(), HasSubstr("max_batch_bytes"));
  v1::Job file_job = Submit(NpyJob(model_id, "data/resnet18.npy", 8));
  EXPECT_EQ(push_one(file_job.id(), ToProto(at::zeros({2, 3, 8, 8}))).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  Cancel(other.id());  // it waits for pushes: cancelling wakes it
  WaitForState(*stub_, other.id(), v1::CANCELLED, 30);
}

TEST_F(ServerTest, BatchesSentInPartsAreJoinedIntoTheSameBatchAndCountOnce) {
  grpc::ClientContext info_context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub_->GetServerInfo(&info_context, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.max_message_bytes(), 8 << 20);  // the defaults a client reads
  EXPECT_EQ(info.max_batch_bytes(), int64_t{256} << 20);
  EXPECT_FALSE(info.version().empty());
  EXPECT_FALSE(info.libtorch_version().empty());

  const std::string model_id = UploadModel();
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id(model_id);
  request.mutable_spec()->set_batch_size(8);
  request.mutable_spec()->mutable_data()->mutable_client_stream();
  const v1::Job job = Submit(request);
  auto source = data::OpenBatchSource("npy:" + kFixtures + "/data/resnet18.npy", 8);
  ASSERT_TRUE(source.ok());
  grpc::ClientContext context;
  v1::PushBatchesResponse pushed;
  auto writer = stub_->PushBatches(&context, &pushed);
  int messages = 0;
  while (true) {
    auto batch = (*source)->Next();
    ASSERT_TRUE(batch.ok());
    if (!*batch) break;
    std::vector<v1::Tensor> inputs = {ToProto((**batch)[0])};
    for (v1::PushBatchesRequest& message : BatchMessages(inputs, 30000)) {  // 98 KB a batch of 8
      message.set_job_id(job.id());
      ASSERT_TRUE(writer->Write(message));
      ++messages;
    }
  }
  v1::PushBatchesRequest last;
  last.set_last(true);
  writer->Write(last);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_GT(messages, 3 * 3);
  EXPECT_EQ(pushed.batches_received(), 3);
  WaitForState(*stub_, job.id(), v1::SUCCEEDED);
  const std::string bn_path = tmp_.File("bn.safetensors");
  std::ofstream(bn_path, std::ios::binary) << Download(*stub_, job.id(), v1::BN_BUFFERS);
  auto reference = engine::testing::ReadSafetensors(kFixtures + "/ref/resnet18.population.safetensors");
  EXPECT_LE(engine::testing::WorstRelativeError(engine::testing::ReadSafetensors(bn_path), reference), 1e-5);

  // A stream that ends inside a batch is refused saying so; the server goes on.
  const v1::Job broken = Submit(request);
  grpc::ClientContext broken_context;
  v1::PushBatchesResponse broken_response;
  auto broken_writer = stub_->PushBatches(&broken_context, &broken_response);
  std::vector<v1::Tensor> inputs = {ToProto(at::zeros({8, 3, 64, 64}))};
  std::vector<v1::PushBatchesRequest> parts = BatchMessages(inputs, 30000);
  parts[0].set_job_id(broken.id());
  for (size_t p = 0; p + 1 < parts.size(); ++p) broken_writer->Write(parts[p]);
  broken_writer->WritesDone();
  const grpc::Status cut = broken_writer->Finish();
  EXPECT_EQ(cut.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(cut.error_message(), HasSubstr("ended inside a batch"));
  Cancel(broken.id());
  WaitForState(*stub_, broken.id(), v1::CANCELLED, 30);
}


// The final summary of a job that ended (from its events).
v1::RunReport Summary(v1::Recal::Stub& stub, const std::string& id) {
  for (const v1::JobEvent& event : Watch(stub, id)) {
    if (event.has_summary()) return event.summary();
  }
  ADD_FAILURE() << "job " << id << " has no summary";
  return {};
}

TEST_F(ServerTest, RecalibratesOnAnImageFolder) {
  ASSERT_EQ(MakeImageFolders(tmp_.path()), 0);
  const std::string model_id = UploadModel();
  v1::Job job = Submit(ImageJob(model_id, "imgs"));  // relative: resolved under the data roots
  v1::Job done = WaitForState(*stub_, job.id(), v1::SUCCEEDED);
  EXPECT_EQ(done.progress().samples_done(), kImageFolderImages);
  const v1::RunReport summary = Summary(*stub_, job.id());
  EXPECT_EQ(summary.samples(), kImageFolderImages);
  EXPECT_EQ(summary.batches(), 2);
  EXPECT_EQ(summary.layers_recalibrated(), 20);
  // The data layer got the folder's canonical path and the numbers as they were sent.
  EXPECT_EQ(summary.data(), "images:" + fs::canonical(own_root()).string() +
                                "/imgs?resize=36&crop=32&mean=0.485,0.456,0.406&std=0.229,0.224,0.225");
  grpc::Status status;
  Download(*stub_, job.id(), v1::BN_BUFFERS, &status);
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(ServerTest, ImageFoldersOutsideTheRootsAreRefusedAndBadFilesFailOrAreSkipped) {
  ASSERT_EQ(MakeImageFolders(tmp_.path()), 0);
  const std::string model_id = UploadModel();
  grpc::Status status;
  Submit(ImageJob(model_id, tmp_.File("outside/imgs")), &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  Submit(ImageJob(model_id, "no_such_folder"), &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  v1::SubmitJobRequest padded = ImageJob(model_id, "imgs");
  padded.mutable_spec()->mutable_data()->mutable_image_folder()->set_crop(40);
  Submit(padded, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("image_folder.crop"));
  // A folder inside the roots whose link leads outside them: the job fails at that file,
  // and on_bad=skip does not hide it.
  fs::create_directories(fs::path(own_root()) / "escape");
  fs::create_directory_symlink(tmp_.File("outside/imgs"), fs::path(own_root()) / "escape" / "out");
  v1::Job escapes = Submit(ImageJob(model_id, "escape", v1::ImageFolderSource::SKIP));
  v1::Job refused = WaitForState(*stub_, escapes.id(), v1::FAILED);
  EXPECT_EQ(refused.error().code(), static_cast<int>(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_THAT(refused.error().message(), HasSubstr("outside the server's data roots"));

  v1::Job fails = Submit(ImageJob(model_id, "with_bad", v1::ImageFolderSource::FAIL));
  v1::Job failed = WaitForState(*stub_, fails.id(), v1::FAILED);
  EXPECT_THAT(failed.error().message(), HasSubstr("x.jpg"));
  EXPECT_EQ(failed.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));

  v1::Job skips = Submit(ImageJob(model_id, "with_bad", v1::ImageFolderSource::SKIP));
  const v1::Job done = WaitForState(*stub_, skips.id(), v1::SUCCEEDED);
  const v1::RunReport summary = Summary(*stub_, skips.id());
  EXPECT_EQ(summary.samples(), kImageFolderImages);
  EXPECT_THAT(summary.data(), HasSubstr("&on_bad=skip"));
  EXPECT_EQ(summary.skipped_files(), 1);
  // The last progress event is sent even though the file count promised one more sample.
  EXPECT_EQ(done.progress().samples_done(), kImageFolderImages);
  EXPECT_EQ(done.progress().batches_done(), done.progress().batches_total());
}

class TwoWorkerServerTest : public ServerTest {
 protected:
  std::vector<std::string> Flags() override {
    // --data_root may also repeat.
    return {"--data_root=" + kFixtures, "--data_root=" + own_root(), "--cpu_workers=2",
            "--threads_per_worker=1"};
  }
};

TEST_F(TwoWorkerServerTest, SeveralJobsRunAtOnceAndEachMatchesItsReference) {
  v1::Model resnet, twice;
  ASSERT_TRUE(Upload(*stub_, ReadBytes(kModel), &resnet).ok());
  ASSERT_TRUE(Upload(*stub_, ReadBytes(kFixtures + "/models/twice.scripted_train.pt"), &twice).ok());
  // Two jobs of a few seconds each: with two workers they run side by side.
  std::vector<v1::Job> long_jobs;
  for (int i = 0; i < 2; ++i) {
    v1::SubmitJobRequest request = LongJob(resnet.id());
    request.mutable_spec()->mutable_options()->set_max_batches(8);
    long_jobs.push_back(Submit(request));
  }
  std::vector<std::pair<v1::Job, std::string>> jobs;
  for (int i = 0; i < 2; ++i) {
    jobs.emplace_back(Submit(NpyJob(resnet.id(), "data/resnet18.npy", 8)), "resnet18");
    jobs.emplace_back(Submit(NpyJob(twice.id(), "data/twice.npy", 8)), "twice");
  }
  for (auto& [job, family] : jobs) {
    std::vector<v1::JobEvent> events = Watch(*stub_, job.id());
    ASSERT_FALSE(events.empty());
    ASSERT_EQ(events.back().state(), v1::SUCCEEDED) << family;
    const std::string path = tmp_.File(job.id() + ".safetensors");
    std::ofstream(path, std::ios::binary) << Download(*stub_, job.id(), v1::BN_BUFFERS);
    auto got = engine::testing::ReadSafetensors(path);
    auto reference = engine::testing::ReadSafetensors(kFixtures + "/ref/" + family + ".population.safetensors");
    EXPECT_LE(engine::testing::WorstRelativeError(got, reference), 1e-5);
  }
  // Both workers were used: some two jobs were running at the same time.
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const v1::Job& job : long_jobs) {
    const v1::Job done = WaitForState(*stub_, job.id(), v1::SUCCEEDED);
    auto nanos = [](const google::protobuf::Timestamp& t) { return t.seconds() * 1000000000LL + t.nanos(); };
    spans.emplace_back(nanos(done.start_time()), nanos(done.end_time()));
  }
  EXPECT_TRUE(spans[0].first < spans[1].second && spans[1].first < spans[0].second)
      << "the two long jobs did not run at the same time";
}

TEST_F(ServerTest, ModelsInUseCannotBeDeletedAndJobsTimeOut) {
  const std::string model_id = UploadModel();
  v1::SubmitJobRequest request = LongJob(model_id);
  request.mutable_spec()->set_timeout_seconds(2);
  v1::Job job = Submit(request);
  grpc::ClientContext context;
  v1::DeleteModelRequest remove;
  remove.set_id(model_id);
  v1::DeleteModelResponse removed;
  grpc::Status in_use = stub_->DeleteModel(&context, remove, &removed);
  EXPECT_EQ(in_use.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  v1::Job failed = WaitForState(*stub_, job.id(), v1::FAILED, 60);
  EXPECT_EQ(failed.error().code(), static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED));
  EXPECT_THAT(failed.error().message(), HasSubstr("timeout"));
  grpc::ClientContext again;
  EXPECT_TRUE(stub_->DeleteModel(&again, remove, &removed).ok());
  grpc::ClientContext get_context;
  v1::GetModelRequest get;
  get.set_id(model_id);
  v1::Model gone;
  EXPECT_EQ(stub_->GetModel(&get_context, get, &gone).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, ServesTheStandardHealthService) {
  auto health = grpc::health::v1::Health::NewStub(server_->Channel());
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// The database deleted under a running server: it says NOT_SERVING, logs why, and refuses
// to write past the file (DATA_LOSS naming it) rather than losing what it is told.
TEST_F(ServerTest, ADatabaseFileRemovedUnderTheServerIsDetectedAndNeverWrittenPast) {
  const std::string model_id = UploadModel();
  ASSERT_TRUE(fs::remove(data_dir_ + "/recal.db"));
  auto health = grpc::health::v1::Health::NewStub(server_->Channel());
  grpc::health::v1::HealthCheckResponse response;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    grpc::ClientContext context;
    ASSERT_TRUE(health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok());
  } while (response.status() == grpc::health::v1::HealthCheckResponse::SERVING &&
           std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  EXPECT_THAT(server_->log(), HasSubstr("recal.db' is gone"));

  grpc::Status refused;
  Submit(NpyJob(model_id, kFixtures + "/data/resnet18.npy", 8), &refused);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(refused.error_message(), HasSubstr("restart the server"));
}

class OneWorkerServerTest : public ServerTest {
 protected:
  std::vector<std::string> Flags() override {
    return {"--data_root=" + kFixtures + "," + own_root(), "--max_queued_jobs=1", "--threads_per_worker=1"};
  }
};

TEST_F(OneWorkerServerTest, CancelsQueuedAndRunningJobsAndBoundsTheQueue) {
  const std::string model_id = UploadModel();
  v1::Job running = Submit(LongJob(model_id));
  WaitForState(*stub_, running.id(), v1::RUNNING);
  v1::Job queued = Submit(LongJob(model_id));
  grpc::Status full;
  Submit(LongJob(model_id), &full);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(), HasSubstr("max_queued_jobs"));

  EXPECT_EQ(Cancel(queued.id()).state(), v1::CANCELLED);
  while (WaitForState(*stub_, running.id(), v1::RUNNING).progress().batches_done() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const auto start = std::chrono::steady_clock::now();
  Cancel(running.id());
  v1::Job cancelled = WaitForState(*stub_, running.id(), v1::CANCELLED, 30);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_GT(cancelled.progress().batches_done(), 0);
  // A model used by no queued or running job can go.
  grpc::ClientContext context;
  v1::DeleteModelRequest remove;
  remove.set_id(model_id);
  v1::DeleteModelResponse removed;
  EXPECT_TRUE(stub_->DeleteModel(&context, remove, &removed).ok());
}

class IdleStreamServerTest : public ServerTest {
 protected:
  std::vector<std::string> Flags() override {
    return {"--data_root=" + kFixtures + "," + own_root(), "--threads_per_worker=1", "--stream_idle_seconds=1"};
  }
};

// A client that submits a client_stream job and never pushes (or stops pushing) does not
// hold the only worker until the job's 6-hour timeout: the job fails after the idle time,
// naming the flag, and the next job runs.
TEST_F(IdleStreamServerTest, AStreamThatIsNeverFedGivesItsWorkerBack) {
  const std::string model_id = UploadModel();
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id(model_id);
  request.mutable_spec()->set_batch_size(8);
  request.mutable_spec()->mutable_data()->mutable_client_stream();
  v1::Job starved = Submit(request);
  v1::Job next = Submit(NpyJob(model_id, kFixtures + "/data/resnet18.npy", 8));

  v1::Job failed = WaitForState(*stub_, starved.id(), v1::FAILED, 30);
  EXPECT_EQ(failed.error().code(), static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED));
  EXPECT_THAT(failed.error().message(), HasSubstr("no batch was pushed for 1s"));
  EXPECT_THAT(failed.error().message(), HasSubstr("--stream_idle_seconds"));
  EXPECT_EQ(WaitForState(*stub_, next.id(), v1::SUCCEEDED, 60).state(), v1::SUCCEEDED);
}

class BusyWorkerServerTest : public ServerTest {
 protected:
  std::vector<std::string> Flags() override {
    return {"--data_root=" + kFixtures, "--cpu_workers=1", "--threads_per_worker=1"};
  }
};

// A job queued behind the only worker says why it waits (GetJob, and a watch's snapshot):
// how many jobs are ahead of it and how many run.
TEST_F(BusyWorkerServerTest, AJobQueuedBehindABusyWorkerSaysHowManyAreAheadOfIt) {
  const std::string model_id = UploadModel();
  v1::SubmitJobRequest never_fed;
  never_fed.mutable_spec()->set_model_id(model_id);
  never_fed.mutable_spec()->set_batch_size(8);
  never_fed.mutable_spec()->mutable_data()->mutable_client_stream();
  const v1::Job busy = Submit(never_fed);  // holds the worker until cancelled
  ASSERT_EQ(WaitForState(*stub_, busy.id(), v1::RUNNING, 60).state(), v1::RUNNING);
  const v1::Job next = Submit(NpyJob(model_id, "data/resnet18.npy", 8));
  const v1::Job last = Submit(NpyJob(model_id, "data/resnet18.npy", 8));
  const auto get = [&](const std::string& id) { return GetJob(*stub_, id); };
  const v1::Job next_now = get(next.id());
  ASSERT_EQ(next_now.state(), v1::QUEUED);
  EXPECT_EQ(next_now.wait().cause(), v1::JobWait::NEXT_IN_LINE);
  EXPECT_EQ(next_now.wait().jobs_running(), 1);
  const v1::Job last_now = get(last.id());
  EXPECT_EQ(last_now.wait().jobs_ahead(), 1);
  EXPECT_EQ(last_now.wait().reason(), "1 job is ahead of it (by priority, then age); 1 job runs now");
  const std::vector<v1::JobEvent> head = Watch(*stub_, last.id(), 0, 1);
  ASSERT_EQ(head.size(), 1u);
  EXPECT_EQ(head[0].snapshot().wait().jobs_ahead(), 1);
  EXPECT_FALSE(get(busy.id()).has_wait());
  for (const v1::Job& job : {last, next, busy}) Cancel(job.id());
}

TEST_F(OneWorkerServerTest, WatchersResumeBySeqAndSeveralWatchAtOnce) {
  const std::string model_id = UploadModel();
  v1::SubmitJobRequest request = LongJob(model_id);
  request.mutable_spec()->set_batch_size(8);
  request.mutable_spec()->mutable_options()->set_max_batches(30);
  v1::Job job = Submit(request);
  std::vector<std::vector<v1::JobEvent>> watched(3);
  std::vector<std::thread> watchers;
  for (auto& events : watched) {
    watchers.emplace_back([&] { events = Watch(*stub_, job.id()); });
  }
  // One watcher breaks off after three events and comes back with the last seq it saw.
  std::vector<v1::JobEvent> head = Watch(*stub_, job.id(), 0, 3);
  ASSERT_EQ(head.size(), 3u);
  std::vector<v1::JobEvent> tail = Watch(*stub_, job.id(), head.back().seq());
  for (auto& w : watchers) w.join();
  ASSERT_GE(tail.size(), 2u);
  EXPECT_TRUE(tail[0].has_snapshot());
  EXPECT_EQ(tail[1].seq(), head.back().seq() + 1);
  EXPECT_EQ(tail.back().state(), v1::SUCCEEDED);
  for (const auto& events : watched) {
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back().seq(), tail.back().seq());
  }
}

// 200 watchers waiting on a running job are subscriptions, not threads: the server's thread
// count stays far below the watcher count; shutdown ends every one with UNAVAILABLE.
TEST_F(OneWorkerServerTest, WaitingWatchersHoldNoServerThreadAndShutdownEndsThemUnavailable) {
  const std::string model_id = UploadModel();
  v1::SubmitJobRequest request = LongJob(model_id);
  request.mutable_spec()->mutable_options()->set_max_batches(100000);
  v1::Job job = Submit(request);
  WaitForState(*stub_, job.id(), v1::RUNNING);
  constexpr int kWatchers = 200;
  std::atomic<int> started{0};
  std::vector<grpc::StatusCode> ended(kWatchers, grpc::StatusCode::OK);
  std::vector<std::thread> watchers;
  for (int i = 0; i < kWatchers; ++i) {
    watchers.emplace_back([&, i] {
      grpc::ClientContext context;
      v1::WatchJobRequest watch;
      watch.set_id(job.id());
      auto reader = stub_->WatchJob(&context, watch);
      v1::JobEvent event;
      bool first = true;
      while (reader->Read(&event)) {
        if (first) started.fetch_add(1);
        first = false;
      }
      ended[i] = reader->Finish().error_code();
    });
  }
  for (int i = 0; i < 600 && started.load() < kWatchers; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(started.load(), kWatchers);
  int threads = 0;
  for ([[maybe_unused]] const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(server_->pid()) + "/task")) {
    ++threads;
  }
  EXPECT_LT(threads, kWatchers / 2) << "server threads with " << kWatchers << " watchers waiting";
  server_->Terminate(120);
  for (auto& w : watchers) w.join();
  for (grpc::StatusCode code : ended) EXPECT_EQ(code, grpc::StatusCode::UNAVAILABLE);
  Restart();
}

TEST_F(OneWorkerServerTest, AJobKilledMidRunCompletesAfterRestart) {
  const std::string model_id = UploadModel();
  v1::Job done = Submit(NpyJob(model_id, "data/resnet18.npy", 8));
  WaitForState(*stub_, done.id(), v1::SUCCEEDED);
  grpc::Status status;
  const std::string before = Download(*stub_, done.id(), v1::MODEL, &status);
  v1::SubmitJobRequest request = LongJob(model_id);
  request.mutable_spec()->mutable_options()->set_max_batches(20);
  v1::Job job = Submit(request);
  WaitForState(*stub_, job.id(), v1::RUNNING);
  std::vector<v1::JobEvent> seen = Watch(*stub_, job.id(), 0, 3);
  server_->Kill();

  Restart();
  v1::Job finished = WaitForState(*stub_, job.id(), v1::SUCCEEDED, 300);
  EXPECT_EQ(finished.attempts(), 2);
  // The watch resumes across the restart without a gap.
  std::vector<v1::JobEvent> rest = Watch(*stub_, job.id(), seen.back().seq());
  ASSERT_GE(rest.size(), 2u);
  EXPECT_EQ(rest[1].seq(), seen.back().seq() + 1);
  // Everything stored before the crash is intact.
  EXPECT_EQ(Download(*stub_, done.id(), v1::MODEL, &status), before);
  grpc::ClientContext context;
  v1::GetModelRequest get;
  get.set_id(model_id);
  v1::Model model;
  EXPECT_TRUE(stub_->GetModel(&context, get, &model).ok());
}

TEST_F(OneWorkerServerTest, AJobThatKeepsTakingTheServerDownEndsFailed) {
  // A job during which the server dies, every time: re-queued at start-up at most
  // --max_attempts times, then FAILED, never a crash loop.
  std::vector<std::string> flags = Flags();
  flags.push_back("--max_attempts=2");
  Restart(flags);
  const std::string model_id = UploadModel();
  v1::Job job = Submit(LongJob(model_id));
  for (int attempt = 1; attempt <= 2; ++attempt) {
    const v1::Job running = WaitForState(*stub_, job.id(), v1::RUNNING);
    EXPECT_EQ(running.attempts(), attempt);
    server_->Kill();
    Restart(flags);
  }
  const v1::Job failed = WaitForState(*stub_, job.id(), v1::FAILED, 30);
  EXPECT_EQ(failed.attempts(), 2);
  EXPECT_THAT(failed.error().message(), HasSubstr("--max_attempts=2"));
  // The server goes on with other work.
  WaitForState(*stub_, Submit(NpyJob(model_id, "data/resnet18.npy", 8)).id(), v1::SUCCEEDED);
}

TEST_F(OneWorkerServerTest, SigtermStopsPromptlyAndLeavesTheJobQueued) {
  const std::string model_id = UploadModel();
  v1::Job job = Submit(LongJob(model_id));
  WaitForState(*stub_, job.id(), v1::RUNNING);
  EXPECT_EQ(server_->Terminate(20), 0) << server_->log();
  Restart();
  grpc::ClientContext get_context;
  v1::GetJobRequest get;
  get.set_id(job.id());
  v1::Job after;
  ASSERT_TRUE(stub_->GetJob(&get_context, get, &after).ok());
  EXPECT_THAT(after.state(), ::testing::AnyOf(v1::QUEUED, v1::RUNNING));
  Cancel(job.id());
}

}  // namespace
}  // namespace recal::testing
