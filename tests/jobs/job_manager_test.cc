// JobManager over a fake JobRunner (no model, no worker process): what a runner's outcome
// does to a job — results adopted only as plain files, failures, cancellation and the
// timeout handed to the runner — with the real SQLite store and blob store underneath.
#include "server/jobs/job_manager.h"

#include <atomic>
#include <filesystem>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "server/store/local_blob_store.h"
#include "tests/jobs/fake_runner.h"

namespace recal::jobs {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metadata_ = *store::OpenMetadataStore(tmp_.File("recal.db"));
    blobs_ = *store::LocalBlobStore::Open(tmp_.File("blobs"));
    models_ = std::make_unique<ModelRegistry>(metadata_.get(), blobs_.get(), 1 << 20, &runner_,
                                              [this](const std::string&) {
                                                TenantLimits limits;
                                                limits.max_stored_bytes = max_stored_bytes_;
                                                return limits;
                                              });
    JobManagerOptions options;
    options.scheduler.progress_interval = absl::ZeroDuration();
    jobs_ = std::make_unique<JobManager>(metadata_.get(), blobs_.get(), models_.get(), &runner_, options);
    ASSERT_TRUE(jobs_->Start().ok());
    model_id_ = UploadAnyModel(*models_);
    ASSERT_FALSE(model_id_.empty());
  }
  void TearDown() override { jobs_->Shutdown(absl::Seconds(10)); }

  v1::Job Submit(double timeout_seconds = 0) {
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_model_id(model_id_);
    request.mutable_spec()->set_batch_size(4);
    request.mutable_spec()->set_timeout_seconds(timeout_seconds);
    request.mutable_spec()->mutable_data()->mutable_synthetic()->add_sample_shape(3);
    auto job = jobs_->Submit(caller_, request);
    EXPECT_TRUE(job.ok()) << job.status();
    return *job;
  }
  v1::Job WaitForEnd(const std::string& id) {
    for (int i = 0; i < 500; ++i) {
      auto job = jobs_->Get(caller_, id);
      if (job.ok() && IsTerminal(job->state())) return *job;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "job " << id << " did not end";
    return *jobs_->Get(caller_, id);
  }

  testing::TempDir tmp_;
  FakeRunner runner_;
  std::atomic<int64_t> max_stored_bytes_{0};  // the models' and the results' quota
  std::unique_ptr<store::MetadataStore> metadata_;
  std::unique_ptr<store::LocalBlobStore> blobs_;
  std::unique_ptr<ModelRegistry> models_;
  std::unique_ptr<JobManager> jobs_;
  std::string model_id_;
  const Caller caller_{"t"};
};

TEST_F(JobManagerTest, SucceededRunsLeaveTheirFilesAsResultsAndTheirProgressAsEvents) {
  runner_.recalibrate = [](const RecalibrationTask& task, const RunHooks& hooks) -> absl::StatusOr<v1::RunReport> {
    EXPECT_TRUE(task.model_path.size() > 0 && fs::exists(task.model_path));
    EXPECT_TRUE(task.plan.data().has_synthetic()) << task.plan.ShortDebugString();
    for (int batch = 1; batch <= 3; ++batch) {
      worker::v1::Progress progress;
      progress.set_batches(batch);
      progress.set_samples(4 * batch);
      progress.set_max_batches(3);
      hooks.on_progress(progress);
    }
    WriteResults(task);
    v1::RunReport report;
    report.set_batches(3);
    return report;
  };
  const v1::Job job = WaitForEnd(Submit().id());
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.error().message();
  EXPECT_EQ(job.progress().batches_done(), 3);
  auto model = jobs_->Result(caller_, job.id(), v1::MODEL);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(testing::ReadBytes(blobs_->PathOf(model->sha256)), "bytes of model.pt");
  // Nothing of the run is left in scratch (its directory is <job>.attempt-<n>).
  for (const auto& entry : fs::directory_iterator(blobs_->scratch_dir())) {
    EXPECT_FALSE(absl::StartsWith(entry.path().filename().string(), job.id())) << entry.path();
  }
}

TEST_F(JobManagerTest, ARunnerFailureFailsTheJobWithItsMessageAndTheNextJobRuns) {
  runner_.recalibrate = [](const RecalibrationTask&, const RunHooks&) -> absl::StatusOr<v1::RunReport> {
    return absl::InternalError("the worker running the model was killed by SIGSEGV (Segmentation fault)");
  };
  v1::Job job = WaitForEnd(Submit().id());
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.error().message(), HasSubstr("SIGSEGV"));
  runner_.recalibrate = [](const RecalibrationTask& task, const RunHooks&) -> absl::StatusOr<v1::RunReport> {
    WriteResults(task);
    return v1::RunReport();
  };
  EXPECT_EQ(WaitForEnd(Submit().id()).state(), v1::SUCCEEDED);
}

// A job's results are reserved before they are stored (issue 49): results that would pass
// the tenant's max_stored_bytes fail the job, saying so, and store nothing; within it they
// are stored and nothing stays reserved.
TEST_F(JobManagerTest, AJobWhoseResultsWouldPassTheQuotaFailsSayingSoAndStoresNothing) {
  runner_.recalibrate = [](const RecalibrationTask& task, const RunHooks&) -> absl::StatusOr<v1::RunReport> {
    WriteResults(task);  // 17 + 23 + 20 bytes
    return v1::RunReport();
  };
  const int64_t model_bytes = models_->Usage("t")->stored_bytes();
  max_stored_bytes_ = model_bytes + 59;
  const v1::Job refused = WaitForEnd(Submit().id());
  EXPECT_EQ(refused.state(), v1::FAILED);
  EXPECT_EQ(refused.error().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(refused.error().message(),
              ::testing::AllOf(HasSubstr("this job's results 60"), HasSubstr("max_stored_bytes")));
  EXPECT_EQ(models_->Usage("t")->stored_bytes(), model_bytes);

  max_stored_bytes_ = model_bytes + 60;
  EXPECT_EQ(WaitForEnd(Submit().id()).state(), v1::SUCCEEDED);
  const v1::Usage usage = *models_->Usage("t");
  EXPECT_EQ(usage.result_bytes(), 60);
  EXPECT_EQ(usage.reserved_bytes(), 0);
}

TEST_F(JobManagerTest, CancellationAndTheTimeoutReachTheRunner) {
  runner_.recalibrate = [](const RecalibrationTask&, const RunHooks& hooks) -> absl::StatusOr<v1::RunReport> {
    // A model that never ends: only what the runner is told from outside stops it.
    while (true) {
      if (hooks.cancel && hooks.cancel->load()) return absl::CancelledError("cancelled");
      if (absl::Now() > hooks.deadline) return absl::DeadlineExceededError("past the deadline");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  const v1::Job running = Submit();
  for (int i = 0; i < 200 && jobs_->Get(caller_, running.id())->state() != v1::RUNNING; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(jobs_->Cancel(caller_, running.id()).ok());
  EXPECT_EQ(WaitForEnd(running.id()).state(), v1::CANCELLED);

  const v1::Job late = WaitForEnd(Submit(/*timeout_seconds=*/0.3).id());
  EXPECT_EQ(late.state(), v1::FAILED);
  EXPECT_THAT(late.error().message(), HasSubstr("timeout of 0.3 s"));
}

TEST_F(JobManagerTest, FilesAWorkerLinkedElsewhereAreNotAdopted) {
  testing::WriteBytes(tmp_.File("secret"), "the server's secret");
  const std::string secret = tmp_.File("secret");
  runner_.recalibrate = [&](const RecalibrationTask& task, const RunHooks&) -> absl::StatusOr<v1::RunReport> {
    WriteResults(task);
    fs::remove(fs::path(task.scratch_dir) / "model.pt");
    fs::create_symlink(secret, fs::path(task.scratch_dir) / "model.pt");
    return v1::RunReport();
  };
  const v1::Job job = WaitForEnd(Submit().id());
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.error().message(), HasSubstr("not a plain file"));
  EXPECT_FALSE(jobs_->Result(caller_, job.id(), v1::MODEL).ok());
  EXPECT_EQ(testing::ReadBytes(secret), "the server's secret");
}

// Two api replicas (no workers: their jobs stay queued) on one store, each with a connection
// of its own: a tenant's quotas are counted in the store, so they hold across both.
// A job is submitted with any reference to a model and keeps the full id it resolved to:
// bytes uploaded under the name after it do not change what it runs.
TEST_F(JobManagerTest, AJobKeepsTheFullIdItsModelReferenceResolvedTo) {
  runner_.recalibrate = [](const RecalibrationTask& task, const RunHooks&) -> absl::StatusOr<v1::RunReport> {
    WriteResults(task);
    return v1::RunReport();
  };
  const std::string first = UploadAnyModel(*models_, "t", "rn50 bytes", "rn50");
  ASSERT_FALSE(first.empty());
  for (const std::string& reference : {std::string("rn50"), std::string("rn50:1"), first.substr(7, 6), first}) {
    model_id_ = reference;
    const v1::Job job = Submit();
    EXPECT_EQ(job.spec().model_id(), first) << reference;
    EXPECT_EQ(jobs_->Get(caller_, job.id())->spec().model_id(), first) << reference;
  }
  model_id_ = "rn50";
  const v1::Job before = Submit();
  const std::string second = UploadAnyModel(*models_, "t", "newer rn50 bytes", "rn50");
  ASSERT_FALSE(second.empty());
  EXPECT_EQ(WaitForEnd(before.id()).spec().model_id(), first);
  EXPECT_EQ(Submit().spec().model_id(), second);
  // Resolution happens in the caller's tenant only.
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id("rn50");
  request.mutable_spec()->set_batch_size(4);
  request.mutable_spec()->mutable_data()->mutable_synthetic()->add_sample_shape(3);
  EXPECT_TRUE(absl::IsNotFound(jobs_->Submit(Caller{"u"}, request).status()));
  request.mutable_spec()->set_model_id("");
  EXPECT_THAT(jobs_->Submit(caller_, request).status().message(), HasSubstr("spec.model_id is required"));
}

// The model's input contract against the data at submit, before a worker is spent: a job
// whose data cannot fit is refused (and not stored); a model stored before contracts has
// none, and its jobs are checked by the worker alone.
TEST_F(JobManagerTest, DataThatCannotFitTheModelsInputsIsRefusedAtSubmit) {
  runner_.recalibrate = [](const RecalibrationTask& task, const RunHooks&) -> absl::StatusOr<v1::RunReport> {
    WriteResults(task);
    return v1::RunReport();
  };
  v1::ModelInput* x = runner_.inputs.Add();
  x->set_name("x");
  x->set_dtype("float32");
  x->add_dims()->set_fixed(8);  // a static batch of 8
  x->add_dims()->set_fixed(3);
  const std::string exported = UploadAnyModel(*models_, "t", "a program's bytes", "program");
  ASSERT_FALSE(exported.empty());
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id(exported);
  request.mutable_spec()->set_batch_size(4);
  request.mutable_spec()->mutable_data()->mutable_synthetic()->add_sample_shape(3);
  const absl::StatusOr<v1::Job> refused = jobs_->Submit(caller_, request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("the data synthetic:3,seed=0 does not fit the model: input 'x' dim 0 (the batch) is 4, but the program "
                        "was exported for batches of exactly 8"));
  request.mutable_spec()->set_batch_size(8);
  EXPECT_TRUE(jobs_->Submit(caller_, request).ok());
  request.mutable_spec()->set_model_id(model_id_);  // uploaded in SetUp, without a contract
  request.mutable_spec()->set_batch_size(4);
  EXPECT_TRUE(jobs_->Submit(caller_, request).ok());
}

TEST_F(JobManagerTest, QuotasHoldAcrossTwoApiReplicasOnOneStore) {
  jobs_->Shutdown(absl::Seconds(10));  // runs nothing here
  const std::string u_model = UploadAnyModel(*models_, "u");
  ASSERT_FALSE(u_model.empty());
  std::unique_ptr<store::MetadataStore> other_store = *store::OpenMetadataStore(tmp_.File("recal.db"));
  ModelRegistry other_models(other_store.get(), blobs_.get(), 1 << 20, &runner_);
  JobManagerOptions options;
  options.scheduler.devices = {};
  options.limits = [](const std::string& tenant) {
    TenantLimits limits;
    if (tenant == "t") limits.max_active_jobs = 3;
    if (tenant == "u") limits.max_submissions_per_minute = 2;
    return limits;
  };
  JobManager a(metadata_.get(), blobs_.get(), models_.get(), &runner_, options);
  JobManager b(other_store.get(), blobs_.get(), &other_models, &runner_, options);
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(b.Start().ok());
  const auto request = [&](const std::string& request_id = "") {
    v1::SubmitJobRequest r;
    r.set_request_id(request_id);
    r.mutable_spec()->set_model_id(model_id_);
    r.mutable_spec()->set_batch_size(4);
    r.mutable_spec()->mutable_data()->mutable_synthetic()->add_sample_shape(3);
    return r;
  };
  JobManager* replicas[] = {&a, &b};

  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto job = replicas[i % 2]->Submit(caller_, request(i == 0 ? "first" : ""));
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->id());
  }
  for (JobManager* replica : replicas) {
    auto over = replica->Submit(caller_, request());
    ASSERT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
    EXPECT_THAT(over.status().message(), HasSubstr("has 3 jobs queued or running, its quota max_active_jobs=3"));
  }
  // A retry through the other replica is answered with its job, over quota or not.
  auto retried = b.Submit(caller_, request("first"));
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->id(), ids[0]);
  // One ends (cancelled through one replica): the other takes one more.
  ASSERT_TRUE(a.Cancel(caller_, ids[1]).ok());
  ASSERT_TRUE(b.Submit(caller_, request()).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(a.Submit(caller_, request()).status()));

  const Caller u{"u"};
  v1::SubmitJobRequest u_request = request();
  u_request.mutable_spec()->set_model_id(u_model);
  auto first = a.Submit(u, u_request);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(b.Submit(u, u_request).ok());
  ASSERT_TRUE(a.Cancel(u, first->id()).ok());  // submissions, not active jobs
  for (JobManager* replica : replicas) {
    auto over = replica->Submit(u, u_request);
    ASSERT_TRUE(absl::IsResourceExhausted(over.status())) << over.status();
    EXPECT_THAT(over.status().message(),
                HasSubstr("submitted 2 jobs in the last minute, its quota max_submissions_per_minute=2"));
  }
  a.Shutdown(absl::Seconds(10));
  b.Shutdown(absl::Seconds(10));
}

// TenantLimits::max_running_jobs reaches the claims of the manager's workers: with two
// workers, tenant "t" bound to one leaves the other to "u", whose job came last.
TEST_F(JobManagerTest, ATenantsRunningJobsBoundLeavesTheSecondWorkerToAnotherTenant) {
  jobs_->Shutdown(absl::Seconds(10));  // runs nothing here
  const std::string u_model = UploadAnyModel(*models_, "u");
  ASSERT_FALSE(u_model.empty());
  runner_.recalibrate = [](const RecalibrationTask&, const RunHooks& hooks) -> absl::StatusOr<v1::RunReport> {
    while (!(hooks.cancel && hooks.cancel->load())) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return absl::CancelledError("cancelled");
  };
  JobManagerOptions options;
  options.scheduler.devices = {"cpu", "cpu"};
  options.limits = [](const std::string& tenant) {
    TenantLimits limits;
    if (tenant == "t") limits.max_running_jobs = 1;
    return limits;
  };
  JobManager manager(metadata_.get(), blobs_.get(), models_.get(), &runner_, options);
  ASSERT_TRUE(manager.Start().ok());
  const auto submit = [&](const Caller& caller, const std::string& model) {
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_model_id(model);
    request.mutable_spec()->set_batch_size(4);
    request.mutable_spec()->mutable_data()->mutable_synthetic()->add_sample_shape(3);
    auto job = manager.Submit(caller, request);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  };
  const auto wait_for = [&](const Caller& caller, const std::string& id, v1::JobState state) {
    for (int i = 0; i < 1000 && manager.Get(caller, id)->state() != state; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return manager.Get(caller, id)->state();
  };
  const Caller u{"u"};
  const std::string t_first = submit(caller_, model_id_);
  const std::string t_second = submit(caller_, model_id_);
  ASSERT_EQ(wait_for(caller_, t_first, v1::RUNNING), v1::RUNNING);
  const std::string u_job = submit(u, u_model);
  ASSERT_EQ(wait_for(u, u_job, v1::RUNNING), v1::RUNNING) << "t's second job took the second worker";
  EXPECT_EQ(manager.Get(caller_, t_second)->state(), v1::QUEUED);
  ASSERT_TRUE(manager.Cancel(caller_, t_first).ok());
  EXPECT_EQ(wait_for(caller_, t_second, v1::RUNNING), v1::RUNNING);
  EXPECT_EQ(manager.Get(u, u_job)->state(), v1::RUNNING);
  for (const auto& [caller, id] : {std::pair{caller_, t_second}, std::pair{u, u_job}}) {
    ASSERT_TRUE(manager.Cancel(caller, id).ok());
  }
  manager.Shutdown(absl::Seconds(10));
}

// A runner whose every run lasts until it is cancelled: it holds its worker.
absl::StatusOr<v1::RunReport> RunUntilCancelled(const RecalibrationTask&, const RunHooks& hooks) {
  while (!(hooks.cancel && hooks.cancel->load())) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return absl::CancelledError("cancelled");
}

v1::JobState WaitForState(JobManager& manager, const Caller& caller, const std::string& id, v1::JobState state) {
  for (int i = 0; i < 1000 && manager.Get(caller, id)->state() != state; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return manager.Get(caller, id)->state();
}

TEST_F(JobManagerTest, AQueuedJobSaysHowManyJobsAreAheadOfItAndHowManyRun) {
  runner_.recalibrate = RunUntilCancelled;
  const v1::Job running = Submit();
  ASSERT_EQ(WaitForState(*jobs_, caller_, running.id(), v1::RUNNING), v1::RUNNING);
  const v1::Job next = Submit();
  const v1::Job last = Submit();
  const v1::JobWait next_wait = jobs_->Get(caller_, next.id())->wait();
  EXPECT_EQ(next_wait.cause(), v1::JobWait::NEXT_IN_LINE);
  EXPECT_EQ(next_wait.jobs_ahead(), 0);
  EXPECT_EQ(next_wait.jobs_running(), 1);
  EXPECT_EQ(next_wait.reason(), "it is next in line (1 job runs now): the next worker that is free takes it");
  const v1::JobWait last_wait = jobs_->Get(caller_, last.id())->wait();
  EXPECT_EQ(last_wait.cause(), v1::JobWait::JOBS_AHEAD);
  EXPECT_EQ(last_wait.jobs_ahead(), 1);
  EXPECT_EQ(last_wait.tenant_running(), 1);
  EXPECT_EQ(last_wait.tenant_max_running(), 0);
  EXPECT_EQ(last_wait.reason(), "1 job is ahead of it (by priority, then age); 1 job runs now");
  // Only a queued job waits; another tenant's stays unseen; list rows leave it out.
  EXPECT_FALSE(jobs_->Get(caller_, running.id())->has_wait());
  EXPECT_TRUE(absl::IsNotFound(jobs_->Get(Caller{"u"}, last.id()).status()));
  const absl::StatusOr<store::JobPage> listed = jobs_->List("t", {v1::QUEUED}, 0, "");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->jobs.size(), 2u);
  for (const v1::Job& job : listed->jobs) EXPECT_FALSE(job.has_wait());
  for (const v1::Job& job : {running, next, last}) ASSERT_TRUE(jobs_->Cancel(caller_, job.id()).ok());
  EXPECT_FALSE(WaitForEnd(last.id()).has_wait());
}

TEST_F(JobManagerTest, AQueuedJobOfATenantAtItsRunningBoundSaysSo) {
  jobs_->Shutdown(absl::Seconds(10));  // runs nothing here
  runner_.recalibrate = RunUntilCancelled;
  JobManagerOptions options;
  options.scheduler.devices = {"cpu", "cpu"};
  options.limits = [](const std::string&) {
    TenantLimits limits;
    limits.max_running_jobs = 1;
    return limits;
  };
  JobManager manager(metadata_.get(), blobs_.get(), models_.get(), &runner_, options);
  ASSERT_TRUE(manager.Start().ok());
  const auto submit = [&] {
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_model_id(model_id_);
    request.mutable_spec()->set_batch_size(4);
    request.mutable_spec()->mutable_data()->mutable_synthetic()->add_sample_shape(3);
    return manager.Submit(caller_, request)->id();
  };
  const std::string first = submit();
  ASSERT_EQ(WaitForState(manager, caller_, first, v1::RUNNING), v1::RUNNING);
  const std::string second = submit();
  const v1::JobWait wait = manager.Get(caller_, second)->wait();
  EXPECT_EQ(wait.cause(), v1::JobWait::TENANT_AT_BOUND);
  EXPECT_EQ(wait.tenant_running(), 1);
  EXPECT_EQ(wait.tenant_max_running(), 1);
  EXPECT_EQ(wait.reason(),
            "its tenant already runs 1 job, its bound (max_running_jobs in the auth file, or the server's "
            "--tenant_max_running_jobs): it starts when one of them ends");
  for (const std::string& id : {first, second}) ASSERT_TRUE(manager.Cancel(caller_, id).ok());
  manager.Shutdown(absl::Seconds(10));
}

// An api replica runs no worker: until a worker process is heard from, its queued jobs say
// that none is; a sharded job waits for a coordinator, its shards in the queue.
TEST_F(JobManagerTest, AnApiReplicasQueuedJobSaysThatNoWorkerIsHeardFromUntilOneIs) {
  jobs_->Shutdown(absl::Seconds(10));  // runs nothing here
  JobManagerOptions options;
  options.scheduler.devices = {};
  JobManager api(metadata_.get(), blobs_.get(), models_.get(), &runner_, options);
  ASSERT_TRUE(api.Start().ok());
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id(model_id_);
  request.mutable_spec()->set_batch_size(4);
  request.mutable_spec()->mutable_data()->mutable_synthetic()->add_sample_shape(3);
  const std::string plain = api.Submit(caller_, request)->id();
  request.mutable_spec()->set_shards(2);
  const std::string sharded = api.Submit(caller_, request)->id();
  const auto wait_of = [&](const std::string& id) { return api.Get(caller_, id)->wait(); };

  EXPECT_EQ(wait_of(plain).cause(), v1::JobWait::NO_WORKER);
  EXPECT_EQ(wait_of(plain).reason(),
            "no worker has been heard from in the last 35 s: start a worker (recal-server --role worker) or "
            "check its logs");
  EXPECT_EQ(wait_of(sharded).cause(), v1::JobWait::NO_WORKER);
  const int64_t now = absl::ToUnixMillis(absl::Now());
  ASSERT_TRUE(metadata_->PutWorkerEndpoint("worker-1", "10.0.0.1:50052", now).ok());
  EXPECT_EQ(wait_of(plain).cause(), v1::JobWait::STARTING);
  EXPECT_EQ(wait_of(plain).reason(), "it is next in line: an idle worker takes it up within moments");
  EXPECT_EQ(wait_of(sharded).cause(), v1::JobWait::COORDINATOR);
  EXPECT_THAT(wait_of(sharded).reason(), HasSubstr("waits for a worker's coordinator to take it up; its shards queue"));
  const std::vector<v1::Job> shards = *metadata_->ChildJobs(sharded);
  ASSERT_EQ(shards.size(), 2u);
  EXPECT_EQ(wait_of(shards[1].id()).cause(), v1::JobWait::JOBS_AHEAD);
  EXPECT_EQ(wait_of(shards[1].id()).jobs_ahead(), 2);  // the plain job and shard 0
  // A worker that stopped says so (its endpoint as heard from at the epoch).
  ASSERT_TRUE(metadata_->PutWorkerEndpoint("worker-1", "10.0.0.1:50052", 0).ok());
  EXPECT_EQ(wait_of(plain).cause(), v1::JobWait::NO_WORKER);
  api.Shutdown(absl::Seconds(10));
}

}  // namespace
}  // namespace recal::jobs
