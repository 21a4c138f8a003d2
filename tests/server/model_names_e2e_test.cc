// Model names, versions and references through the real recal-server (docs/models.md): two
// tenants, uploads of different archives under one name, jobs submitted by every form of
// reference keeping the exact bytes they resolved to, ambiguous digest prefixes, deletion by
// reference, and another tenant's names, prefixes and ids tried as an attacker would.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "server/store/metadata_store.h"
#include "tests/server/calls.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kFixtures = RECAL_FIXTURES_DIR;
// Three different archives: two of one architecture (Linear -> BatchNorm1d on 12 features)
// and one that cannot run on its data (Conv1d over 4 channels), so a job that ran the wrong
// bytes fails.
const std::string kEval2d = kFixtures + "/models/bn1d_2d.traced_eval.pt";
const std::string kTrain2d = kFixtures + "/models/bn1d_2d.traced_train.pt";
const std::string kConv3d = kFixtures + "/models/bn1d_3d.traced_train.pt";
const std::string kData2d = "data/bn1d_2d.npy";

// Digests no upload can make share 6 digits: seeded into the store before the server starts.
const std::string kTwin1 = "sha256:abcdef" + std::string(57, '0') + "1";
const std::string kTwin2 = "sha256:abcdef" + std::string(57, '0') + "2";

class ModelNamesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* who : {"a", "b", "b-read", "c", "d"}) tokens_[who] = NewToken();
    // team-c keeps one version of each name; team-d may store 200,000 bytes.
    std::ofstream(tmp_.File("auth.txt")) << AuthLine(tokens_["a"], "team-a", "admin")
                                         << AuthLine(tokens_["b"], "team-b", "admin")
                                         << AuthLine(tokens_["b-read"], "team-b", "read")
                                         << AuthLine(tokens_["c"], "team-c", "admin")
                                         << AuthLine(tokens_["d"], "team-d", "admin") << "tenant team-c keep_versions=1\n"
                                         << "tenant team-d max_stored_bytes=200000\n";
    std::filesystem::create_directories(tmp_.File("data"));
    SeedTwins();
    StartServer();
  }

  // The retention sweeper looks every 0.2 s; uploads idle for a minute expire.
  void StartServer() {
    server_.reset();
    server_ = std::make_unique<ServerProcess>(
        tmp_.File("data"),
        std::vector<std::string>{"--auth_file=" + tmp_.File("auth.txt"), "--data_root=" + kFixtures,
                                 "--cpu_workers=1", "--retention_interval_seconds=0.2", "--upload_idle_seconds=60"},
        ServerProcess::Auth::kOpen);
    ASSERT_TRUE(server_->ok()) << server_->log();
  }

  // Two models of team-a whose digests share the prefix "abcdef" (their bytes are never read).
  void SeedTwins() {
    auto store = store::OpenMetadataStore("sqlite:" + tmp_.File("data/recal.db"));
    ASSERT_TRUE(store.ok()) << store.status();
    for (const std::string& id : {kTwin1, kTwin2}) {
      v1::Model model;
      model.set_id(id);
      model.set_tenant("team-a");
      model.set_name("twin");
      model.set_size(1);
      ASSERT_TRUE((*store)->PutModel(model).ok());
    }
  }

  std::unique_ptr<v1::Recal::Stub> As(const std::string& who) { return server_->Stub(tokens_.at(who)); }

  v1::Model UploadAs(const std::string& who, const std::string& path, const std::string& name) {
    v1::Model model;
    const grpc::Status status = UploadNamed(*As(who), ReadBytes(path), name, &model);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return model;
  }
  grpc::Status GetModel(const std::string& who, const std::string& reference, v1::Model* model) {
    grpc::ClientContext context;
    v1::GetModelRequest request;
    request.set_id(reference);
    return As(who)->GetModel(&context, request, model);
  }
  grpc::Status Submit(const std::string& who, const v1::SubmitJobRequest& request, v1::Job* job) {
    grpc::ClientContext context;
    return As(who)->SubmitJob(&context, request, job);
  }
  grpc::Status Delete(const std::string& who, const std::string& reference, v1::DeleteModelResponse* response) {
    grpc::ClientContext context;
    v1::DeleteModelRequest request;
    request.set_id(reference);
    return As(who)->DeleteModel(&context, request, response);
  }
  // A client-stream job nobody pushes to: it holds the only worker until it is cancelled.
  v1::Job StartBlocker(const std::string& reference, const std::string& who = "a") {
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_model_id(reference);
    request.mutable_spec()->set_batch_size(8);
    request.mutable_spec()->mutable_data()->mutable_client_stream();
    v1::Job job;
    EXPECT_TRUE(Submit(who, request, &job).ok());
    return WaitForState(*As(who), job.id(), v1::RUNNING);
  }
  void Cancel(const std::string& id, const std::string& who = "a") {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_id(id);
    v1::Job job;
    ASSERT_TRUE(As(who)->CancelJob(&context, request, &job).ok());
  }
  grpc::Status DeleteJob(const std::string& who, const std::string& id, v1::DeleteJobResponse* response) {
    grpc::ClientContext context;
    v1::DeleteJobRequest request;
    request.set_id(id);
    return As(who)->DeleteJob(&context, request, response);
  }
  grpc::Status Usage(const std::string& who, v1::Usage* usage, const std::string& tenant = "") {
    grpc::ClientContext context;
    v1::GetUsageRequest request;
    request.set_tenant(tenant);
    return As(who)->GetUsage(&context, request, usage);
  }
  v1::Usage UsageOf(const std::string& who) {
    v1::Usage usage;
    const grpc::Status status = Usage(who, &usage);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return usage;
  }
  // The versions of `name` the caller's tenant has, newest first.
  std::vector<int64_t> Versions(const std::string& who, const std::string& name) {
    grpc::ClientContext context;
    v1::ListModelsRequest request;
    request.set_name(name);
    v1::ListModelsResponse listed;
    EXPECT_TRUE(As(who)->ListModels(&context, request, &listed).ok());
    std::vector<int64_t> versions;
    for (const v1::Model& model : listed.models()) versions.push_back(model.version());
    return versions;
  }

  TempDir tmp_;
  std::map<std::string, std::string> tokens_;
  std::unique_ptr<ServerProcess> server_;
};

std::string NameVersion(const v1::Model& model) { return model.name() + ":" + std::to_string(model.version()); }

TEST_F(ModelNamesTest, VersionsReferencesAndJobsThatKeepTheirBytes) {
  const v1::Model first = UploadAs("a", kEval2d, "bn.pt");
  const v1::Model second = UploadAs("a", kTrain2d, "bn.pt");
  EXPECT_EQ(NameVersion(first), "bn.pt:1");
  EXPECT_EQ(NameVersion(second), "bn.pt:2");
  // The same bytes again are the same model and version, under any name.
  EXPECT_EQ(NameVersion(UploadAs("a", kEval2d, "bn.pt")), "bn.pt:1");
  EXPECT_EQ(UploadAs("a", kEval2d, "renamed.pt").id(), first.id());

  // Every form of reference, and the full id each job stores.
  const std::map<std::string, std::string> references = {
      {"bn.pt", second.id()},
      {"bn.pt:1", first.id()},
      {second.id().substr(7, 8), second.id()},
      {first.id().substr(0, 7 + 6), first.id()},
      {first.id(), first.id()},
  };
  for (const auto& [reference, id] : references) {
    v1::Model model;
    ASSERT_TRUE(GetModel("a", reference, &model).ok()) << reference;
    EXPECT_EQ(model.id(), id) << reference;
    v1::Job job;
    const grpc::Status submitted = Submit("a", NpyJob(reference, kData2d, 8), &job);
    ASSERT_TRUE(submitted.ok()) << reference << ": " << submitted.error_message();
    EXPECT_EQ(job.spec().model_id(), id) << reference;
    EXPECT_EQ(WaitForState(*As("a"), job.id(), v1::SUCCEEDED).spec().model_id(), id) << reference;
  }

  // A job submitted by name while the worker is busy, then version 3 (other bytes, which
  // cannot run on its data) uploaded before it starts: it runs version 2's bytes.
  const v1::Job blocker = StartBlocker("bn.pt:1");
  v1::Job waiting;
  ASSERT_TRUE(Submit("a", NpyJob("bn.pt", kData2d, 8), &waiting).ok());
  const v1::Model third = UploadAs("a", kConv3d, "bn.pt");
  EXPECT_EQ(NameVersion(third), "bn.pt:3");
  grpc::ClientContext context;
  v1::GetJobRequest get;
  get.set_id(waiting.id());
  v1::Job still;
  ASSERT_TRUE(As("a")->GetJob(&context, get, &still).ok());
  EXPECT_EQ(still.state(), v1::QUEUED);  // the upload came before it ran
  // The model a running job uses cannot be deleted, by any reference to it.
  v1::DeleteModelResponse refused;
  const grpc::Status in_use = Delete("a", first.id().substr(7, 10), &refused);
  EXPECT_EQ(in_use.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << in_use.error_message();
  EXPECT_THAT(in_use.error_message(), HasSubstr("bn.pt:1"));
  Cancel(blocker.id());
  const v1::Job ran = WaitForState(*As("a"), waiting.id(), v1::SUCCEEDED);
  EXPECT_EQ(ran.spec().model_id(), second.id());
  // The same reference now names version 3, whose bytes do not fit the data: the job above
  // would have failed had it run them.
  v1::Job latest;
  ASSERT_TRUE(Submit("a", NpyJob("bn.pt", kData2d, 8), &latest).ok());
  EXPECT_EQ(latest.spec().model_id(), third.id());
  EXPECT_EQ(WaitForState(*As("a"), latest.id(), v1::FAILED).state(), v1::FAILED);

  // ListModels of one name: its versions, newest first, with names and versions.
  grpc::ClientContext list_context;
  v1::ListModelsRequest list;
  list.set_name("bn.pt");
  v1::ListModelsResponse listed;
  ASSERT_TRUE(As("a")->ListModels(&list_context, list, &listed).ok());
  std::vector<std::string> versions;
  for (const v1::Model& model : listed.models()) versions.push_back(NameVersion(model));
  EXPECT_EQ(versions, (std::vector<std::string>{"bn.pt:3", "bn.pt:2", "bn.pt:1"}));

  // Deleting by name takes the latest version, says which, and the name goes back to the one
  // before; the deleted number is not given again.
  v1::DeleteModelResponse deleted;
  ASSERT_TRUE(Delete("a", "bn.pt", &deleted).ok());
  EXPECT_EQ(deleted.model().id(), third.id());
  v1::Model now;
  ASSERT_TRUE(GetModel("a", "bn.pt", &now).ok());
  EXPECT_EQ(NameVersion(now), "bn.pt:2");
  EXPECT_EQ(NameVersion(UploadAs("a", kConv3d, "bn.pt")), "bn.pt:4");
}

TEST_F(ModelNamesTest, AnAmbiguousPrefixIsInvalidArgumentListingTheCandidates) {
  v1::Model model;
  const grpc::Status ambiguous = GetModel("a", "abcdef", &model);
  EXPECT_EQ(ambiguous.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(ambiguous.error_message(),
              AllOf(HasSubstr(kTwin1 + " (twin:1)"), HasSubstr(kTwin2 + " (twin:2)"), HasSubstr("more digits")));
  v1::Job job;
  EXPECT_EQ(Submit("a", NpyJob("sha256:abcdef", kData2d, 8), &job).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::DeleteModelResponse deleted;
  EXPECT_EQ(Delete("a", "abcdef", &deleted).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // The twins differ in their last digit only: all 63 before it are still ambiguous.
  EXPECT_EQ(GetModel("a", kTwin2.substr(0, 70), &model).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(GetModel("a", kTwin2.substr(7), &model).ok());
  EXPECT_EQ(model.id(), kTwin2);
  ASSERT_TRUE(GetModel("a", "twin:1", &model).ok());
  EXPECT_EQ(model.id(), kTwin1);
  EXPECT_EQ(GetModel("a", "rn50:0", &model).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Team b tries team a's names, prefixes and ids: each answers as a model nobody has, and the
// message is the same as for one nobody has.
TEST_F(ModelNamesTest, AnotherTenantsModelsNeverResolve) {
  const v1::Model secret = UploadAs("a", kTrain2d, "secret.pt");
  const std::vector<std::string> references = {
      "secret.pt", "secret.pt:1", secret.id().substr(7, 8), secret.id().substr(0, 7 + 8), secret.id(),
      "abcdef",    "twin"};
  for (const std::string& reference : references) {
    v1::Model model;
    const grpc::Status got = GetModel("b", reference, &model);
    EXPECT_EQ(got.error_code(), grpc::StatusCode::NOT_FOUND) << reference << ": " << got.error_message();
    EXPECT_THAT(got.error_message(), AllOf(Not(HasSubstr("team-a")), Not(HasSubstr("twin:")))) << reference;
    v1::Job job;
    EXPECT_EQ(Submit("b", NpyJob(reference, kData2d, 8), &job).error_code(), grpc::StatusCode::NOT_FOUND) << reference;
    v1::DeleteModelResponse deleted;
    EXPECT_EQ(Delete("b", reference, &deleted).error_code(), grpc::StatusCode::NOT_FOUND) << reference;
  }
  v1::Model model;
  const grpc::Status theirs = GetModel("b", secret.id().substr(7, 8), &model);
  const grpc::Status nobodys = GetModel("b", "12345678", &model);
  EXPECT_EQ(theirs.error_message(), absl::StrCat("no model's digest starts with ", secret.id().substr(7, 8),
                                                 "; list your models to see their names and versions"));
  EXPECT_THAT(nobodys.error_message(), HasSubstr("no model's digest starts with 12345678"));
  // Team b's own "secret.pt" is its version 1, and team a's stays theirs.
  EXPECT_EQ(NameVersion(UploadAs("b", kEval2d, "secret.pt")), "secret.pt:1");
  ASSERT_TRUE(GetModel("a", "secret.pt", &model).ok());
  EXPECT_EQ(model.id(), secret.id());
}

// Deleting jobs: an ended job goes with its results (and its bytes leave the tenant's usage);
// a running one is refused until cancelled; another tenant's id answers as a missing one.
TEST_F(ModelNamesTest, AnEndedJobIsDeletedWithItsResultsAndOnlyByItsTenant) {
  UploadAs("a", kEval2d, "bn.pt");
  v1::Job job;
  ASSERT_TRUE(Submit("a", NpyJob("bn.pt", kData2d, 8), &job).ok());
  WaitForState(*As("a"), job.id(), v1::SUCCEEDED);
  const v1::Usage before = UsageOf("a");
  EXPECT_EQ(before.tenant(), "team-a");
  EXPECT_GE(before.results(), 3);
  EXPECT_GT(before.result_bytes(), 0);

  // Team b, admin of its own tenant, cannot delete team a's job: the same NOT_FOUND, word for
  // word, as for a job nobody has; nor see team a's usage without being an admin.
  v1::DeleteJobResponse deleted;
  const grpc::Status theirs = DeleteJob("b", job.id(), &deleted);
  const grpc::Status nobodys = DeleteJob("b", "job-0000000000000000", &deleted);
  EXPECT_EQ(theirs.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(theirs.error_message(), absl::StrCat("no job '", job.id(), "'"));
  EXPECT_EQ(nobodys.error_message(), "no job 'job-0000000000000000'");
  v1::Usage usage;
  EXPECT_EQ(Usage("b-read", &usage, "team-a").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(UsageOf("b-read").tenant(), "team-b");
  EXPECT_EQ(UsageOf("b-read").results(), 0);

  // A running job is refused, saying what to do; cancelled, it may go.
  const v1::Job blocker = StartBlocker("bn.pt");
  const grpc::Status running = DeleteJob("a", blocker.id(), &deleted);
  EXPECT_EQ(running.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(running.error_message(), HasSubstr("cancel it first"));
  Cancel(blocker.id());
  WaitForState(*As("a"), blocker.id(), v1::CANCELLED);
  ASSERT_TRUE(DeleteJob("a", blocker.id(), &deleted).ok());

  const grpc::Status ok = DeleteJob("a", job.id(), &deleted);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_EQ(deleted.job().id(), job.id());
  EXPECT_EQ(deleted.result_bytes(), before.result_bytes());
  grpc::Status download;
  Download(*As("a"), job.id(), v1::MODEL, &download);
  EXPECT_EQ(download.error_code(), grpc::StatusCode::NOT_FOUND);
  const v1::Usage after = UsageOf("a");
  EXPECT_EQ(after.results(), 0);
  EXPECT_EQ(after.result_bytes(), 0);
  EXPECT_EQ(after.models(), before.models());  // the model stays
  EXPECT_EQ(DeleteJob("a", job.id(), &deleted).error_code(), grpc::StatusCode::NOT_FOUND);
}

// Team c keeps one version of each name (keep_versions=1 in the auth file): the sweeper
// deletes older versions, but never one that a running or a queued job uses.
TEST_F(ModelNamesTest, RetentionKeepsTheNewestVersionsAndNeverOneAQueuedOrRunningJobNeeds) {
  UploadAs("c", kEval2d, "ret.pt");
  const v1::Job running = StartBlocker("ret.pt:1", "c");
  UploadAs("c", kTrain2d, "ret.pt");
  v1::Job queued;
  ASSERT_TRUE(Submit("c", NpyJob("ret.pt:2", kData2d, 8), &queued).ok());
  UploadAs("c", kConv3d, "ret.pt");
  // Several sweeps pass: versions 1 and 2 are beyond keep_versions but their jobs need them.
  absl::SleepFor(absl::Milliseconds(700));
  EXPECT_EQ(Versions("c", "ret.pt"), (std::vector<int64_t>{3, 2, 1}));
  // Once their jobs have ended (cancelled here: no second run needed), the next sweep takes them.
  Cancel(queued.id(), "c");
  Cancel(running.id(), "c");
  WaitForState(*As("c"), running.id(), v1::CANCELLED);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Versions("c", "ret.pt").size() > 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(Versions("c", "ret.pt"), (std::vector<int64_t>{3}));
  // Team a (no retention) keeps every version.
  UploadAs("a", kEval2d, "bn.pt");
  UploadAs("a", kTrain2d, "bn.pt");
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(Versions("a", "bn.pt"), (std::vector<int64_t>{2, 1}));
}

// Issue 35's attack: uploads begun and never finished. They count toward team d's
// max_stored_bytes (200,000) with their whole declared size, also after a restart, so the
// quota stops new ones; idle past --upload_idle_seconds (their files' times and their
// reservations' say so, whatever restarted in between) the sweeper removes them and the tenant
// uploads again.
TEST_F(ModelNamesTest, AbandonedUploadsCountTowardTheQuotaAcrossARestartUntilTheyExpire) {
  int abandoned = 0;
  grpc::Status status;
  std::vector<std::string> digests;
  for (int i = 0; i < 10; ++i) {
    const std::string bytes(60000, static_cast<char>('a' + i));
    v1::Model model;
    status = Upload(*As("d"), bytes, &model, 0, 50000);  // 50,000 of 60,000 bytes, then gone
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
    digests.push_back(Sha256Hex(bytes));
    ++abandoned;
  }
  EXPECT_EQ(abandoned, 3);  // a fourth would need 180,000 + 60,000 > 200,000
  EXPECT_THAT(status.error_message(), HasSubstr("unfinished uploads and results being stored 180000"));
  v1::Usage usage = UsageOf("d");
  EXPECT_EQ(usage.uploads(), 3);
  EXPECT_EQ(usage.upload_bytes(), 150000);
  EXPECT_EQ(usage.reserved_bytes(), 180000);
  EXPECT_EQ(usage.stored_bytes(), 180000);
  EXPECT_EQ(usage.max_stored_bytes(), 200000);
  EXPECT_EQ(UsageOf("a").uploads(), 0);  // another tenant's uploads are not its own

  server_->Kill();
  StartServer();
  usage = UsageOf("d");
  EXPECT_EQ(usage.upload_bytes(), 150000);
  EXPECT_EQ(usage.reserved_bytes(), 180000);
  v1::Model model;
  EXPECT_EQ(Upload(*As("d"), std::string(60000, 'z'), &model).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  // Three minutes idle, as far as the files and the reservations say (the store's own call,
  // backdated): the next sweep takes them.
  const std::string partials = tmp_.File("data/uploads/team-d");
  int aged = 0;
  for (const auto& entry : std::filesystem::directory_iterator(partials)) {
    std::filesystem::last_write_time(entry.path(),
                                     std::filesystem::file_time_type::clock::now() - std::chrono::minutes(3));
    ++aged;
  }
  EXPECT_EQ(aged, 3);
  std::unique_ptr<store::MetadataStore> db = *store::OpenMetadataStore(tmp_.File("data/recal.db"));
  for (const std::string& digest : digests) {
    const int64_t three_minutes_ago = absl::ToUnixMillis(absl::Now() - absl::Minutes(3));
    ASSERT_TRUE(db->Reserve({"team-d", store::UploadReservationKey(digest), 60000}, 0, three_minutes_ago)->granted);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (UsageOf("d").stored_bytes() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(UsageOf("d").upload_bytes(), 0);
  EXPECT_EQ(UsageOf("d").stored_bytes(), 0);
  EXPECT_TRUE(std::filesystem::is_empty(partials));
  const grpc::Status uploaded = UploadNamed(*As("d"), ReadBytes(kEval2d), "after.pt", &model);
  EXPECT_TRUE(uploaded.ok()) << uploaded.error_message();
  EXPECT_EQ(UsageOf("d").models(), 1);
}

}  // namespace
}  // namespace recal::testing
