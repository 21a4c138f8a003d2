// Identities, roles, tenants, quotas and TLS of the real recal-server, tried the way an
// attacker would: every RPC without a credential, with an unknown token, with each role, and
// from another tenant; another tenant's ids, bytes and data roots; the auth file reloaded
// under a live watch; quotas; fairness between tenants; mTLS with good, foreign and expired
// certificates; and the refusal to serve the network without credentials.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <atomic>
#include <map>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <grpcpp/health_check_service_interface.h>
#include <gtest/gtest.h>

#include "common/request_limits.h"
#include "common/sha256.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/server/calls.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const std::string kFixtures = RECAL_FIXTURES_DIR;
const std::string kSmallModel = kFixtures + "/models/bn1d_2d.traced_train.pt";
const std::string kOtherModel = kFixtures + "/models/bn1d_3d.traced_train.pt";
const std::string kResnet = kFixtures + "/models/resnet18.traced_eval.pt";

grpc::StatusCode CodeOf(const grpc::Status& status) { return status.error_code(); }

// Who calls: a token per principal of the test's auth file; "none" sends nothing.
struct Principals {
  std::map<std::string, std::string> tokens;  // name -> token
  std::string auth_file_text;

  void Add(const std::string& name, const std::string& tenant, const std::string& role) {
    tokens[name] = NewToken();
    auth_file_text += AuthLine(tokens[name], tenant, role);
  }
};

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    principals_.Add("a_read", "team-a", "read");
    principals_.Add("a_submit", "team-a", "submit");
    principals_.Add("a_admin", "team-a", "admin");
    principals_.Add("b_submit", "team-b", "submit");
    principals_.tokens["unknown"] = NewToken();  // in no file
    principals_.tokens["none"] = "";
    fs::create_directories(tmp_.File("a-only"));
    fs::copy_file(kFixtures + "/data/bn1d_2d.npy", tmp_.File("a-only/private.npy"));
  }
  void StartServer(const std::string& extra_auth_lines = "", std::vector<std::string> flags = {}) {
    auth_file_ = tmp_.File("auth.txt");
    std::ofstream(auth_file_) << "# the test's principals\n" << principals_.auth_file_text << extra_auth_lines;
    flags.push_back("--auth_file=" + auth_file_);
    flags.push_back("--data_root=" + kFixtures);
    flags.push_back("--data_root=team-a=" + tmp_.File("a-only"));
    flags.push_back("--cpu_workers=2");
    server_ = std::make_unique<ServerProcess>(tmp_.File("data"), flags, ServerProcess::Auth::kOpen);
    ASSERT_TRUE(server_->ok()) << server_->log();
  }
  std::unique_ptr<v1::Recal::Stub> As(const std::string& who) { return server_->Stub(principals_.tokens.at(who)); }

  std::string UploadAs(const std::string& who, const std::string& path, grpc::Status* status = nullptr) {
    v1::Model model;
    grpc::Status s = Upload(*As(who), ReadBytes(path), &model);
    if (status) *status = s;
    else EXPECT_TRUE(s.ok()) << who << ": " << s.error_message();
    return model.id();
  }
  v1::Job SubmitAs(const std::string& who, const v1::SubmitJobRequest& request, grpc::Status* status = nullptr) {
    grpc::ClientContext context;
    v1::Job job;
    grpc::Status s = As(who)->SubmitJob(&context, request, &job);
    if (status) *status = s;
    else EXPECT_TRUE(s.ok()) << who << ": " << s.error_message();
    return job;
  }

  TempDir tmp_;
  Principals principals_;
  std::string auth_file_;
  std::unique_ptr<ServerProcess> server_;
};

// Each call, as each principal; returns the status code.
using Call = std::function<grpc::Status(v1::Recal::Stub&)>;

TEST_F(AuthTest, EveryRpcGivesEachPrincipalTheRightCode) {
  StartServer();
  const std::string model_id = UploadAs("a_submit", kSmallModel);
  const std::string digest = Sha256Hex(ReadBytes(kSmallModel));
  const v1::Job done = SubmitAs("a_submit", NpyJob(model_id, "data/bn1d_2d.npy", 8));
  ASSERT_EQ(WaitForState(*As("a_read"), done.id(), v1::SUCCEEDED).state(), v1::SUCCEEDED);
  v1::SubmitJobRequest stream_request;
  stream_request.mutable_spec()->set_model_id(model_id);
  stream_request.mutable_spec()->set_batch_size(8);
  stream_request.mutable_spec()->mutable_data()->mutable_client_stream();
  const v1::Job stream = SubmitAs("a_submit", stream_request);

  const std::string other_bytes = ReadBytes(kOtherModel);
  const std::map<std::string, Call> calls = {
      {"UploadModel", [&](v1::Recal::Stub& s) { v1::Model m; return Upload(s, other_bytes, &m); }},
      {"GetUploadStatus",
       [&](v1::Recal::Stub& s) {
         grpc::ClientContext c;
         v1::GetUploadStatusRequest r;
         r.set_sha256(digest);
         v1::UploadStatus st;
         grpc::Status status = s.GetUploadStatus(&c, r, &st);
         // Another tenant's bytes look like bytes nobody uploaded: OK, nothing committed.
         if (status.ok() && st.model_id().empty()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "as unknown");
         return status;
       }},
      {"GetModel",
       [&](v1::Recal::Stub& s) {
         grpc::ClientContext c;
         v1::GetModelRequest r;
         r.set_id(model_id);
         v1::Model m;
         return s.GetModel(&c, r, &m);
       }},
      {"ListModels",
       [&](v1::Recal::Stub& s) {
         grpc::ClientContext c;
         v1::ListModelsResponse response;
         grpc::Status status = s.ListModels(&c, v1::ListModelsRequest(), &response);
         for (const v1::Model& model : response.models()) {
           if (model.id() == model_id) return status;
         }
         return status.ok() ? grpc::Status(grpc::StatusCode::NOT_FOUND, "not listed") : status;
       }},
      {"SubmitJob",
       [&](v1::Recal::Stub& s) {
         grpc::ClientContext c;
         v1::Job job;
         return s.SubmitJob(&c, NpyJob(model_id, "data/bn1d_2d.npy", 8), &job);
       }},
      {"GetJob",
       [&](v1::Recal::Stub& s) {
         grpc::ClientContext c;
         v1::GetJobRequest r;
         r.set_id(done.id());
         v1::Job job;
         return s.GetJob(&c, r, &job);
       }},
      {"ListJobs",
       [&](v1::Recal::Stub& s) {
         grpc::ClientContext c;
         v1::ListJobsResponse response;
         grpc::Status status = s.ListJobs(&c, v1::ListJobsRequest(), &response);
         for (const v1::Job& job : response.jobs()) {
           if (job.id() == done.id()) return status;
         }
         return status.ok() ? grpc::Status(grpc::StatusCode::NOT_FOUND, "not listed") : status;
       }},
      {"CancelJob",
       [&](v1::Recal::Stub& s) {
         grpc::ClientContext c;
         v1::CancelJobRequest r;
         r.set_id(done.id());  // ended: a cancel that is allowed changes nothing
         v1::Job job;
         return s.CancelJob(&c, r, &job);
       }},
      {"WatchJob",
       [&](v1::Recal::Stub& s) {
         grpc::Status status;
         Watch(s, done.id(), 0, 100000, &status);
         return status;
       }},
      {"PushBatches",
       [&](v1::Recal::Stub& s) {
         grpc::ClientContext c;
         v1::PushBatchesResponse response;
         auto writer = s.PushBatches(&c, &response);
         v1::PushBatchesRequest message;
         message.set_job_id(stream.id());  // no inputs: names the job only
         writer->Write(message);
         writer->WritesDone();
         return writer->Finish();
       }},
      {"DownloadResult",
       [&](v1::Recal::Stub& s) {
         grpc::Status status;
         Download(s, done.id(), v1::BN_BUFFERS, &status);
         return status;
       }},
      {"GetUsage",
       [&](v1::Recal::Stub& s) {
         grpc::ClientContext c;
         v1::GetUsageRequest r;
         r.set_tenant("team-a");  // its own for team a; another tenant's for team b
         v1::Usage usage;
         return s.GetUsage(&c, r, &usage);
       }},
  };
  using C = grpc::StatusCode;
  const C kUnauth = C::UNAUTHENTICATED, kDenied = C::PERMISSION_DENIED, kOk = C::OK, kNotFound = C::NOT_FOUND;
  // Columns: none, unknown, a_read, a_submit, a_admin, b_submit (another tenant).
  const std::map<std::string, std::vector<C>> expected = {
      {"UploadModel", {kUnauth, kUnauth, kDenied, kOk, kOk, kOk}},
      {"GetUploadStatus", {kUnauth, kUnauth, kOk, kOk, kOk, kNotFound}},
      {"GetModel", {kUnauth, kUnauth, kOk, kOk, kOk, kNotFound}},
      {"ListModels", {kUnauth, kUnauth, kOk, kOk, kOk, kNotFound}},
      {"SubmitJob", {kUnauth, kUnauth, kDenied, kOk, kOk, kNotFound}},
      {"GetJob", {kUnauth, kUnauth, kOk, kOk, kOk, kNotFound}},
      {"ListJobs", {kUnauth, kUnauth, kOk, kOk, kOk, kNotFound}},
      {"CancelJob", {kUnauth, kUnauth, kDenied, kOk, kOk, kNotFound}},
      {"WatchJob", {kUnauth, kUnauth, kOk, kOk, kOk, kNotFound}},
      {"PushBatches", {kUnauth, kUnauth, kDenied, kOk, kOk, kNotFound}},
      {"DownloadResult", {kUnauth, kUnauth, kOk, kOk, kOk, kNotFound}},
      {"GetUsage", {kUnauth, kUnauth, kOk, kOk, kOk, kDenied}},
  };
  const std::vector<std::string> who = {"none", "unknown", "a_read", "a_submit", "a_admin", "b_submit"};
  for (const auto& [name, call] : calls) {
    for (size_t i = 0; i < who.size(); ++i) {
      const grpc::Status status = call(*As(who[i]));
      EXPECT_EQ(CodeOf(status), expected.at(name)[i])
          << name << " as " << who[i] << ": " << status.error_message();
      // The refusal says nothing of what another tenant has.
      if (who[i] == "b_submit" && CodeOf(status) == kNotFound && name != "GetUploadStatus" && name != "ListModels" &&
          name != "ListJobs" && name != "UploadModel") {
        EXPECT_THAT(status.error_message(), ::testing::AnyOf(HasSubstr("no job"), HasSubstr("no model")))
            << name;
        EXPECT_THAT(status.error_message(), ::testing::Not(HasSubstr("team-a")));
      }
    }
  }

  // Deleting is for admins only; an admin may list another tenant's jobs, others may not.
  grpc::ClientContext c1, c2, c3, c4;
  v1::DeleteModelRequest del;
  del.set_id("sha256:" + Sha256Hex(other_bytes));  // uploaded above by team-a, used by no job
  v1::DeleteModelResponse deleted;
  EXPECT_EQ(CodeOf(As("a_submit")->DeleteModel(&c1, del, &deleted)), kDenied);
  grpc::ClientContext c6;
  v1::DeleteJobRequest del_job;
  del_job.set_id(done.id());
  v1::DeleteJobResponse deleted_job;
  EXPECT_EQ(CodeOf(As("a_submit")->DeleteJob(&c6, del_job, &deleted_job)), kDenied);
  v1::ListJobsRequest other_tenant;
  other_tenant.set_tenant("team-a");
  v1::ListJobsResponse listed;
  EXPECT_EQ(CodeOf(As("b_submit")->ListJobs(&c2, other_tenant, &listed)), kDenied);
  other_tenant.set_tenant("*");
  ASSERT_TRUE(As("a_admin")->ListJobs(&c3, other_tenant, &listed).ok());
  EXPECT_GE(listed.jobs_size(), 2);
  grpc::ClientContext c5;
  v1::CancelJobRequest cancel;
  cancel.set_id(stream.id());
  v1::Job cancelled;
  ASSERT_TRUE(As("a_submit")->CancelJob(&c5, cancel, &cancelled).ok());
  EXPECT_EQ(WaitForState(*As("a_read"), stream.id(), v1::CANCELLED, 30).state(), v1::CANCELLED);

  // Health stays open; reflection is off.
  grpc::health::v1::HealthCheckResponse health;
  grpc::ClientContext hc;
  ASSERT_TRUE(grpc::health::v1::Health::NewStub(server_->Channel(""))
                  ->Check(&hc, grpc::health::v1::HealthCheckRequest(), &health)
                  .ok());
  EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  // Every refused call left an audit line naming who and what.
  const std::string log = server_->log();
  EXPECT_THAT(log, HasSubstr("audit"));
  EXPECT_THAT(log, HasSubstr("method=SubmitJob"));
  EXPECT_THAT(log, HasSubstr("refused"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr(principals_.tokens["a_submit"])));  // never the token itself
  const grpc::Status removed = As("a_admin")->DeleteModel(&c4, del, &deleted);
  EXPECT_EQ(CodeOf(removed), kOk) << removed.error_message();
}

TEST_F(AuthTest, AnotherTenantsBytesUploadsAndDataRootsStayItsOwn) {
  StartServer();
  const std::string bytes = ReadBytes(kResnet);
  // team-a breaks off an upload halfway; team-b sees nothing of it and starts from 0.
  v1::Model ignored;
  Upload(*As("a_submit"), bytes, &ignored, 0, 2 << 20, "", /*break_off=*/true);
  grpc::ClientContext c1;
  v1::GetUploadStatusRequest status_request;
  status_request.set_sha256(Sha256Hex(bytes));
  v1::UploadStatus status;
  ASSERT_TRUE(As("b_submit")->GetUploadStatus(&c1, status_request, &status).ok());
  EXPECT_EQ(status.committed_size(), 0);
  grpc::ClientContext c2;
  ASSERT_TRUE(As("a_read")->GetUploadStatus(&c2, status_request, &status).ok());
  EXPECT_GT(status.committed_size(), 0);

  // The same bytes uploaded by both are one blob but two models: deleting team-a's leaves
  // team-b's whole and usable.
  const std::string a_model = UploadAs("a_submit", kSmallModel);
  const std::string b_model = UploadAs("b_submit", kSmallModel);
  EXPECT_EQ(a_model, b_model);
  grpc::ClientContext c3;
  v1::DeleteModelRequest del;
  del.set_id(a_model);
  v1::DeleteModelResponse deleted;
  ASSERT_TRUE(As("a_admin")->DeleteModel(&c3, del, &deleted).ok());
  const v1::Job b_job = SubmitAs("b_submit", NpyJob(b_model, "data/bn1d_2d.npy", 8));
  EXPECT_EQ(WaitForState(*As("b_submit"), b_job.id(), v1::SUCCEEDED).state(), v1::SUCCEEDED);
  grpc::Status refused;
  SubmitAs("a_submit", NpyJob(a_model, "data/bn1d_2d.npy", 8), &refused);
  EXPECT_EQ(CodeOf(refused), grpc::StatusCode::NOT_FOUND);

  // team-a's own data root: team-a reads it, team-b cannot name it, not even by full path.
  const std::string a_again = UploadAs("a_submit", kSmallModel);
  const v1::Job a_private = SubmitAs("a_submit", NpyJob(a_again, tmp_.File("a-only/private.npy"), 8));
  EXPECT_EQ(WaitForState(*As("a_read"), a_private.id(), v1::SUCCEEDED).state(), v1::SUCCEEDED);
  SubmitAs("b_submit", NpyJob(b_model, tmp_.File("a-only/private.npy"), 8), &refused);
  EXPECT_EQ(CodeOf(refused), grpc::StatusCode::PERMISSION_DENIED) << refused.error_message();
  SubmitAs("b_submit", NpyJob(b_model, "private.npy", 8), &refused);
  EXPECT_NE(CodeOf(refused), grpc::StatusCode::OK) << refused.error_message();

  // A request_id team-a used finds nothing of team-a's for team-b.
  v1::SubmitJobRequest keyed = NpyJob(a_again, "data/bn1d_2d.npy", 8);
  keyed.set_request_id("same-key");
  const v1::Job a_keyed = SubmitAs("a_submit", keyed);
  keyed.mutable_spec()->set_model_id(b_model);
  const v1::Job b_keyed = SubmitAs("b_submit", keyed);
  EXPECT_NE(a_keyed.id(), b_keyed.id());
  EXPECT_EQ(b_keyed.tenant(), "team-b");
}

TEST_F(AuthTest, QuotasRefuseWithResourceExhaustedNamingTheQuota) {
  const int64_t small_size = static_cast<int64_t>(ReadBytes(kSmallModel).size());
  // Room for the model and two jobs' results (each the model again, its BatchNorm buffers and
  // its report: a few hundred bytes more), not for another model after them.
  const int64_t quota = small_size + 2 * (small_size + 500) + 1000;
  StartServer("tenant team-b max_active_jobs=1 max_submissions_per_minute=3 max_stored_bytes=" +
              std::to_string(quota) + "\n");
  const std::string model = UploadAs("b_submit", kSmallModel);
  grpc::Status over;

  v1::SubmitJobRequest stream;
  stream.mutable_spec()->set_model_id(model);
  stream.mutable_spec()->set_batch_size(8);
  stream.mutable_spec()->mutable_data()->mutable_client_stream();
  const v1::Job waiting = SubmitAs("b_submit", stream);  // stays active until cancelled
  SubmitAs("b_submit", stream, &over);
  EXPECT_EQ(CodeOf(over), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.error_message(), HasSubstr("max_active_jobs=1"));
  // Another tenant is not held to team-b's quotas.
  const std::string a_model = UploadAs("a_submit", kSmallModel);
  SubmitAs("a_submit", NpyJob(a_model, "data/bn1d_2d.npy", 8));

  grpc::ClientContext c;
  v1::CancelJobRequest cancel;
  cancel.set_id(waiting.id());
  v1::Job cancelled;
  ASSERT_TRUE(As("b_submit")->CancelJob(&c, cancel, &cancelled).ok());
  WaitForState(*As("b_submit"), waiting.id(), v1::CANCELLED, 30);
  // Refused submissions do not count: these are the second and third of the minute.
  for (int i = 0; i < 2; ++i) {
    const v1::Job next = SubmitAs("b_submit", NpyJob(model, "data/bn1d_2d.npy", 8));
    WaitForState(*As("b_submit"), next.id(), v1::SUCCEEDED);
  }
  SubmitAs("b_submit", NpyJob(model, "data/bn1d_2d.npy", 8), &over);
  EXPECT_EQ(CodeOf(over), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.error_message(), HasSubstr("max_submissions_per_minute=3"));
  // The results count: another model no longer fits.
  UploadAs("b_submit", kOtherModel, &over);
  EXPECT_EQ(CodeOf(over), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(over.error_message(), HasSubstr("max_stored_bytes=" + std::to_string(quota)));
}

TEST_F(AuthTest, OneTenantsQueueDoesNotHoldBackAnother) {
  StartServer("", {"--cpu_workers=1"});
  const std::string a_model = UploadAs("a_submit", kResnet);
  const std::string b_model = UploadAs("b_submit", kSmallModel);
  std::vector<v1::Job> a_jobs;
  for (int i = 0; i < 6; ++i) {
    v1::SubmitJobRequest request = LongJob(a_model);
    request.mutable_spec()->mutable_options()->set_max_batches(2);
    request.mutable_spec()->mutable_options()->set_allow_short_data(true);
    a_jobs.push_back(SubmitAs("a_submit", request));
  }
  const v1::Job b_job = SubmitAs("b_submit", NpyJob(b_model, "data/bn1d_2d.npy", 8));
  const v1::Job b_done = WaitForState(*As("b_submit"), b_job.id(), v1::SUCCEEDED, 300);
  // At most the job that was running and the one started before b's arrived ran first.
  int a_started_before_b = 0;
  for (const v1::Job& job : a_jobs) {
    grpc::ClientContext c;
    v1::GetJobRequest get;
    get.set_id(job.id());
    v1::Job now;
    ASSERT_TRUE(As("a_read")->GetJob(&c, get, &now).ok());
    if (now.has_start_time() && (now.start_time().seconds() < b_done.start_time().seconds() ||
                                 (now.start_time().seconds() == b_done.start_time().seconds() &&
                                  now.start_time().nanos() < b_done.start_time().nanos()))) {
      ++a_started_before_b;
    }
  }
  EXPECT_LE(a_started_before_b, 2) << "team-b's one job waited behind team-a's queue";
  for (const v1::Job& job : a_jobs) WaitForState(*As("a_read"), job.id(), v1::SUCCEEDED, 300);
}

TEST_F(AuthTest, SighupReloadsTokensWithoutDroppingAWatchAndKeepsTheOldFileIfTheNewOneIsBroken) {
  StartServer();
  const std::string model = UploadAs("a_submit", kResnet);
  v1::SubmitJobRequest request = LongJob(model);
  request.mutable_spec()->mutable_options()->set_max_batches(40);
  const v1::Job job = SubmitAs("a_submit", request);
  std::vector<v1::JobEvent> watched;
  grpc::Status watch_status;
  std::thread watcher([&] { watched = Watch(*As("a_read"), job.id(), 0, 100000, &watch_status); });

  // A broken file: the server says so and keeps the tokens it has.
  std::ofstream(auth_file_) << "token-sha256:not-hex tenant=team-a role=read\n";
  server_->Hangup();
  for (int i = 0; i < 100 && server_->log().find("not reloaded") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_THAT(server_->log(), HasSubstr("line 1"));
  grpc::ClientContext c1;
  v1::GetJobRequest get;
  get.set_id(job.id());
  v1::Job seen;
  EXPECT_TRUE(As("a_read")->GetJob(&c1, get, &seen).ok());

  // Rotate: a_read's token goes, a new one comes.
  const std::string rotated = NewToken();
  std::ofstream(auth_file_) << AuthLine(rotated, "team-a", "admin") << AuthLine(principals_.tokens["a_submit"], "team-a", "submit");
  server_->Hangup();
  for (int i = 0; i < 100 && server_->log().find("auth file reloaded") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  grpc::ClientContext c2, c3;
  EXPECT_EQ(CodeOf(As("a_read")->GetJob(&c2, get, &seen)), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(server_->Stub(rotated)->GetJob(&c3, get, &seen).ok());

  // The watch opened with the old token goes on to the job's end.
  grpc::ClientContext c4;
  v1::CancelJobRequest cancel;
  cancel.set_id(job.id());
  v1::Job cancelled;
  ASSERT_TRUE(As("a_submit")->CancelJob(&c4, cancel, &cancelled).ok());
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  ASSERT_FALSE(watched.empty());
  EXPECT_EQ(watched.back().state(), v1::CANCELLED);
}

// A job the server keeps (a client stream nobody pushes to) with the largest fields a client
// may send: what an attacker would store to make listings too large to receive.
v1::SubmitJobRequest LargestJob(const std::string& model, int n) {
  v1::SubmitJobRequest request;
  request.set_request_id(std::to_string(100000 + n) + std::string(limits::kMaxRequestIdBytes - 6, 'r'));
  v1::JobSpec& spec = *request.mutable_spec();
  spec.set_model_id(model);
  spec.set_batch_size(8);
  for (int i = 0; i < limits::kMaxLabels; ++i) {
    std::string key = std::to_string(1000 + i) + std::string(limits::kMaxLabelKeyBytes - 4, 'k');
    (*spec.mutable_labels())[key] = std::string(limits::kMaxLabelValueBytes, 'v');
  }
  v1::ClientStreamSource& stream = *spec.mutable_data()->mutable_client_stream();
  for (int i = 0; i < limits::kMaxChannelValues; ++i) {
    stream.add_mean(0.5f);
    stream.add_std(0.25f);
  }
  spec.mutable_options()->set_include(std::string(limits::kMaxPatternBytes, 'i'));
  spec.mutable_options()->set_exclude(std::string(limits::kMaxPatternBytes, 'e'));
  return request;
}

v1::SubmitJobRequest StreamJob(const std::string& model, int32_t priority) {
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id(model);
  request.mutable_spec()->set_batch_size(8);
  request.mutable_spec()->set_priority(priority);
  request.mutable_spec()->mutable_data()->mutable_client_stream();
  return request;
}

TEST_F(AuthTest, OversizedFieldsAndPrioritiesBeyondTheRoleAreRefusedBeforeAnythingIsStored) {
  StartServer();
  const std::string model = UploadAs("a_submit", kSmallModel);
  using C = grpc::StatusCode;
  // A 6 MB label (the attacker's "name"), and 1,000 labels.
  grpc::Status refused;
  v1::SubmitJobRequest named = StreamJob(model, 0);
  (*named.mutable_spec()->mutable_labels())["name"] = std::string(6 << 20, 'n');
  SubmitAs("a_submit", named, &refused);
  EXPECT_EQ(CodeOf(refused), C::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("spec.labels value is 6291456 bytes; at most 1024 are allowed"));
  v1::SubmitJobRequest labelled = StreamJob(model, 0);
  for (int i = 0; i < 1000; ++i) (*labelled.mutable_spec()->mutable_labels())["l" + std::to_string(i)] = "v";
  SubmitAs("a_submit", labelled, &refused);
  EXPECT_EQ(CodeOf(refused), C::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("spec.labels has 1000 entries; at most 64 are allowed"));
  // A 6 MB model name, a 7 MB id, a 7 MB page token, a 2 KB token.
  v1::Model uploaded;
  refused = UploadNamed(*As("a_submit"), ReadBytes(kOtherModel), std::string(6 << 20, 'm'), &uploaded);
  EXPECT_EQ(CodeOf(refused), C::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("header.name is 6291456 bytes; at most 128 are allowed"));
  grpc::ClientContext c1, c2, c3;
  v1::GetJobRequest get;
  get.set_id(std::string(7 << 20, 'j'));
  v1::Job job;
  refused = As("a_read")->GetJob(&c1, get, &job);
  EXPECT_EQ(CodeOf(refused), C::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("id is 7340032 bytes; at most 128 are allowed"));
  v1::ListJobsRequest list;
  list.set_page_token(std::string(7 << 20, 't'));
  v1::ListJobsResponse listed;
  refused = As("a_read")->ListJobs(&c2, list, &listed);
  EXPECT_EQ(CodeOf(refused), C::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("page_token is 7340032 bytes; at most 256 are allowed"));
  // DeleteJob and GetUsage as every other call, even for an admin, who may name any tenant.
  grpc::ClientContext c5, c6;
  v1::DeleteJobRequest delete_job;
  delete_job.set_id(std::string(7 << 20, 'j'));
  v1::DeleteJobResponse deleted;
  refused = As("a_admin")->DeleteJob(&c5, delete_job, &deleted);
  EXPECT_EQ(CodeOf(refused), C::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("id is 7340032 bytes; at most 128 are allowed"));
  v1::GetUsageRequest usage_of;
  usage_of.set_tenant(std::string(7 << 20, 't'));
  v1::Usage usage;
  refused = As("a_admin")->GetUsage(&c6, usage_of, &usage);
  EXPECT_EQ(CodeOf(refused), C::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("tenant is 7340032 bytes; at most 64 are allowed"));
  refused = server_->Stub(std::string(2048, 'a'))->ListJobs(&c3, v1::ListJobsRequest(), &listed);
  EXPECT_EQ(CodeOf(refused), C::UNAUTHENTICATED);
  EXPECT_THAT(refused.error_message(), HasSubstr("at most 1024 are allowed"));

  // A tenant's priority stays within -100..100; an admin's need not.
  SubmitAs("a_submit", StreamJob(model, 2147483647), &refused);
  EXPECT_EQ(CodeOf(refused), C::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("spec.priority 2147483647 is outside -100..100"));
  SubmitAs("b_submit", StreamJob(model, -101), &refused);  // refused before the model is looked up
  EXPECT_EQ(CodeOf(refused), C::PERMISSION_DENIED);
  // Nothing refused was stored: the listing holds only what is accepted from here on.
  grpc::ClientContext c4;
  ASSERT_TRUE(As("a_admin")->ListJobs(&c4, v1::ListJobsRequest(), &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 0);
  EXPECT_EQ(SubmitAs("a_submit", StreamJob(model, 100)).spec().priority(), 100);
  EXPECT_EQ(SubmitAs("a_submit", StreamJob(model, -100)).spec().priority(), -100);
  EXPECT_EQ(SubmitAs("a_admin", StreamJob(model, 1000000)).spec().priority(), 1000000);
}

// A client-stream job holds its worker until its batches end or it is cancelled: a slow job
// whose end the test decides.
void CancelAs(v1::Recal::Stub& stub, const std::string& id) {
  grpc::ClientContext context;
  v1::CancelJobRequest cancel;
  cancel.set_id(id);
  v1::Job job;
  ASSERT_TRUE(stub.CancelJob(&context, cancel, &job).ok()) << id;
  EXPECT_EQ(WaitForState(stub, id, v1::CANCELLED, 60).state(), v1::CANCELLED) << id;
}

int64_t Nanos(const google::protobuf::Timestamp& t) { return t.seconds() * 1000000000 + t.nanos(); }

TEST_F(AuthTest, ATenantAtItsRunningBoundLeavesTheOtherWorkerToAnotherTenant) {
  // Two workers; team-a is held to one by the flag, team-b's own line lets it have both.
  StartServer("tenant team-b max_running_jobs=2\n", {"--tenant_max_running_jobs=1"});
  const std::string a_model = UploadAs("a_submit", kSmallModel);
  const std::string b_model = UploadAs("b_submit", kSmallModel);
  std::vector<v1::Job> b_jobs = {SubmitAs("b_submit", StreamJob(b_model, 0)), SubmitAs("b_submit", StreamJob(b_model, 0))};
  for (const v1::Job& job : b_jobs) ASSERT_EQ(WaitForState(*As("b_submit"), job.id(), v1::RUNNING, 60).state(), v1::RUNNING);
  for (const v1::Job& job : b_jobs) CancelAs(*As("b_submit"), job.id());

  std::vector<v1::Job> a_jobs;
  for (int i = 0; i < 3; ++i) a_jobs.push_back(SubmitAs("a_submit", StreamJob(a_model, i == 2 ? 100 : 0)));
  ASSERT_EQ(WaitForState(*As("a_submit"), a_jobs[0].id(), v1::RUNNING, 60).state(), v1::RUNNING);
  // team-b's job, submitted after all of team-a's, gets the second worker: had team-a's
  // second job taken it, this would wait until one of team-a's ended.
  const v1::Job b_late = SubmitAs("b_submit", StreamJob(b_model, 0));
  ASSERT_EQ(WaitForState(*As("b_submit"), b_late.id(), v1::RUNNING, 60).state(), v1::RUNNING) << server_->log();
  for (int i : {1, 2}) {
    const v1::Job waiting = GetJob(*As("a_read"), a_jobs[i].id());
    EXPECT_EQ(waiting.state(), v1::QUEUED) << "team-a's job " << i << " went past its bound";
    EXPECT_FALSE(waiting.has_start_time());
  }
  // A free worker is not enough: team-a's next job starts only once its running one has ended.
  CancelAs(*As("b_submit"), b_late.id());
  CancelAs(*As("a_submit"), a_jobs[0].id());
  const v1::Job a_first = GetJob(*As("a_read"), a_jobs[0].id());
  // The priority-100 job of team-a goes first among its own, never beyond its bound.
  const v1::Job a_next = WaitForState(*As("a_read"), a_jobs[2].id(), v1::RUNNING, 60);
  ASSERT_EQ(a_next.state(), v1::RUNNING);
  EXPECT_GE(Nanos(a_next.start_time()), Nanos(a_first.end_time())) << "team-a ran two jobs at once";
  EXPECT_EQ(GetJob(*As("a_read"), a_jobs[1].id()).state(), v1::QUEUED);
  CancelAs(*As("a_submit"), a_jobs[2].id());
  CancelAs(*As("a_submit"), a_jobs[1].id());
}

// The tenant's second job, with a worker free, says that the tenant's bound holds it.
TEST_F(AuthTest, AJobOfATenantAtItsRunningBoundSaysSoWhenRead) {
  StartServer("tenant team-a max_running_jobs=1\n");
  const std::string a_model = UploadAs("a_submit", kSmallModel);
  const v1::Job first = SubmitAs("a_submit", StreamJob(a_model, 0));
  ASSERT_EQ(WaitForState(*As("a_submit"), first.id(), v1::RUNNING, 60).state(), v1::RUNNING);
  const v1::Job second = SubmitAs("a_submit", StreamJob(a_model, 0));
  const v1::Job waiting = GetJob(*As("a_read"), second.id());
  ASSERT_EQ(waiting.state(), v1::QUEUED);
  EXPECT_EQ(waiting.wait().cause(), v1::JobWait::TENANT_AT_BOUND);
  EXPECT_EQ(waiting.wait().tenant_running(), 1);
  EXPECT_EQ(waiting.wait().tenant_max_running(), 1);
  EXPECT_THAT(waiting.wait().reason(), HasSubstr("its tenant already runs 1 job, its bound (max_running_jobs"));
  // Another tenant sees no more of it than of a job that does not exist.
  grpc::ClientContext context;
  v1::GetJobRequest get;
  get.set_id(second.id());
  v1::Job seen;
  EXPECT_EQ(As("b_submit")->GetJob(&context, get, &seen).error_code(), grpc::StatusCode::NOT_FOUND);
  CancelAs(*As("a_submit"), second.id());
  CancelAs(*As("a_submit"), first.id());
}

TEST_F(AuthTest, ListingsOfTheLargestAllowedFieldsStayBelowTheMessageLimitAndReturnEverything) {
  StartServer("", {"--cpu_workers=1"});
  const std::string a_model = UploadAs("a_submit", kSmallModel);
  const std::string b_model = UploadAs("b_submit", kSmallModel);
  std::set<std::string> a_ids, all_ids;
  for (int i = 0; i < 24; ++i) {
    const std::string& who = i % 4 == 3 ? "b_submit" : "a_submit";
    const v1::Job job = SubmitAs(who, LargestJob(who == "a_submit" ? a_model : b_model, i));
    ASSERT_FALSE(job.id().empty());
    if (who == "a_submit") a_ids.insert(job.id());
    all_ids.insert(job.id());
  }
  // Every page of the tenant's and the admin's listings, following the tokens.
  const auto list_all = [&](const std::string& who, const std::string& tenant) {
    std::set<std::string> ids;
    int pages = 0;
    v1::ListJobsRequest request;
    request.set_tenant(tenant);
    request.set_page_size(1000);
    do {
      grpc::ClientContext c;
      v1::ListJobsResponse response;
      const grpc::Status status = As(who)->ListJobs(&c, request, &response);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok()) break;
      EXPECT_LE(static_cast<int64_t>(response.ByteSizeLong()), limits::kListPageBytes);
      EXPECT_GT(response.jobs_size(), 0);
      for (const v1::Job& job : response.jobs()) EXPECT_TRUE(ids.insert(job.id()).second) << job.id();
      request.set_page_token(response.next_page_token());
      ++pages;
    } while (!request.page_token().empty());
    EXPECT_GT(pages, 1) << "the listing fits in one page: the test stores too little";
    return ids;
  };
  EXPECT_EQ(list_all("a_read", ""), a_ids);
  EXPECT_EQ(list_all("a_admin", "*"), all_ids);

  const Result listed = RunBinary(RECALCTL_BIN, {"list", "--server=" + server_->target(), "--page_size=1000"},
                                  {"RECAL_TOKEN=" + principals_.tokens["a_read"]});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_THAT(listed.out, HasSubstr("next_page_token: "));
}

TEST_F(AuthTest, AThousandUnauthenticatedCallsWithHugeIdsWriteABoundedLogAndAreCounted) {
  StartServer();
  const size_t log_before = server_->log().size();
  // 1,000 GetJob calls without a token, each naming a 1 MiB id (the attack's 7 MB ids only
  // take longer to send: the clipping does not depend on the size), from 8 connections.
  const std::string id(1 << 20, 'x');
  std::atomic<int> unauthenticated{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 8; ++t) {
    callers.emplace_back([&] {
      auto stub = As("none");
      v1::GetJobRequest request;
      request.set_id(id);
      for (int i = 0; i < 125; ++i) {
        grpc::ClientContext c;
        v1::Job job;
        if (CodeOf(stub->GetJob(&c, request, &job)) == grpc::StatusCode::UNAUTHENTICATED) ++unauthenticated;
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(unauthenticated.load(), 1000);

  // A few audit lines, each with the id clipped; the rest counted, not written.
  const std::string log = server_->log().substr(log_before);
  EXPECT_LT(log.size(), 16u << 10) << log.substr(0, 4096);
  EXPECT_THAT(log, HasSubstr("(1048576 bytes, truncated)"));
  EXPECT_THAT(log, HasSubstr("audit: further ones from this peer are counted, not logged"));
  const std::string metrics = ScrapeMetrics(server_->metrics_port());
  EXPECT_THAT(metrics, HasSubstr("\nrecal_unauthenticated_requests_total 1000\n"));
}

TEST(AuthStartTest, ServingTheNetworkWithoutCredentialsNeedsToBeAskedFor) {
  TempDir tmp;
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, STDERR_FILENO);
    execl(RECAL_SERVER_BIN, RECAL_SERVER_BIN, "--listen=0.0.0.0:0", "--metrics_listen=",
          ("--data_dir=" + tmp.File("data")).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);

  ServerProcess refused(tmp.File("data2"), {"--listen=0.0.0.0:0"}, ServerProcess::Auth::kOpen);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(refused.log(), HasSubstr("--auth_file"));
  EXPECT_THAT(refused.log(), HasSubstr("--allow_unauthenticated"));

  ServerProcess open(tmp.File("data3"), {"--listen=0.0.0.0:0", "--allow_unauthenticated"},
                     ServerProcess::Auth::kOpen);
  ASSERT_TRUE(open.ok()) << open.log();
  EXPECT_THAT(open.log(), HasSubstr("WITHOUT authentication"));
}

// mTLS: certificates made at test time by tests/certs/make_test_certs.sh.
class TlsTest : public AuthTest {
 protected:
  void SetUp() override {
    AuthTest::SetUp();
    certs_ = tmp_.File("certs");
    ASSERT_EQ(std::system(("bash " RECAL_SOURCE_DIR "/tests/certs/make_test_certs.sh " + certs_).c_str()), 0);
    StartServer("cert:trainer-a.example tenant=team-a role=submit\n",
                {"--tls_cert=" + certs_ + "/server.pem", "--tls_key=" + certs_ + "/server.key",
                 "--tls_client_ca=" + certs_ + "/ca.pem"});
  }
  std::shared_ptr<grpc::ChannelCredentials> Credentials(const std::string& client) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = ReadBytes(certs_ + "/ca.pem");
    if (!client.empty()) {
      options.pem_cert_chain = ReadBytes(certs_ + "/" + client + ".pem");
      options.pem_private_key = ReadBytes(certs_ + "/" + client + ".key");
    }
    return grpc::SslCredentials(options);
  }
  grpc::Status ListJobsOver(const std::string& client, const std::string& token = "") {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    auto stub = v1::Recal::NewStub(ChannelWithToken(server_->target(), token, Credentials(client), args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListJobsResponse response;
    return stub->ListJobs(&context, v1::ListJobsRequest(), &response);
  }

  std::string certs_;
};

TEST_F(TlsTest, TheClientCertificateIsTheIdentityAndOnlyTheCaItTrustsGetsIn) {
  EXPECT_TRUE(ListJobsOver("client").ok()) << ListJobsOver("client").error_message();
  // A token still decides when one is sent over the mutual-TLS connection.
  EXPECT_EQ(CodeOf(ListJobsOver("client", NewToken())), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(ListJobsOver("client", principals_.tokens["b_submit"]).ok());
  // No certificate, one from another CA, an expired one: no connection at all.
  EXPECT_EQ(CodeOf(ListJobsOver("")), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(CodeOf(ListJobsOver("stranger")), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(CodeOf(ListJobsOver("expired")), grpc::StatusCode::UNAVAILABLE);
  // Plaintext to a TLS port gets nowhere either.
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListJobsResponse response;
  EXPECT_FALSE(server_->Stub(principals_.tokens["a_read"])->ListJobs(&context, v1::ListJobsRequest(), &response).ok());

  // recalctl speaks it too.
  const std::string command = std::string(RECALCTL_BIN) + " list --server=" + server_->target() +
                              " --tls_ca=" + certs_ + "/ca.pem --tls_cert=" + certs_ + "/client.pem --tls_key=" +
                              certs_ + "/client.key --tls_server_name=localhost > /dev/null";
  EXPECT_EQ(std::system(command.c_str()), 0);
  EXPECT_THAT(server_->log(), HasSubstr("tls=mutual"));
}

}  // namespace
}  // namespace recal::testing
