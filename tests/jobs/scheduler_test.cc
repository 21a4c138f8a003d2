// The scheduler over a fake JobRunner and the real repository: the order jobs run in, a
// cancel before a job runs, the queue's bound, shutdown handing running jobs to the next
// start, and start-up taking up what a dead process left.
#include "server/jobs/scheduler.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/jobs/job_plan.h"
#include "server/store/local_blob_store.h"
#include "tests/jobs/fake_runner.h"

namespace recal::jobs {
namespace {

using ::testing::ElementsAre;

// A gate a fake run waits at until the test opens it.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    changed_.notify_all();
  }
  // False if `cancel` was set first.
  bool Wait(const std::atomic<bool>* cancel) {
    std::unique_lock<std::mutex> lock(mu_);
    while (!open_) {
      if (cancel && cancel->load()) return false;
      changed_.wait_for(lock, std::chrono::milliseconds(10));
    }
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  bool open_ = false;
};

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metadata_ = *store::OpenMetadataStore(tmp_.File("recal.db"));
    blobs_ = *store::LocalBlobStore::Open(tmp_.File("blobs"));
    models_ = std::make_unique<ModelRegistry>(metadata_.get(), blobs_.get(), 1 << 20, &runner_);
    jobs_ = std::make_unique<JobRepository>(metadata_.get(), &events_);
    model_id_ = UploadAnyModel(*models_);
    ASSERT_FALSE(model_id_.empty());
    runner_.recalibrate = [this](const RecalibrationTask& task, const RunHooks& hooks) -> absl::StatusOr<v1::RunReport> {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ran_.push_back(std::filesystem::path(task.scratch_dir).stem().string());
      }
      if (!gate_.Wait(hooks.cancel)) return absl::CancelledError("stopped");
      WriteResults(task);
      return v1::RunReport();
    };
  }
  void TearDown() override {
    gate_.Open();
    if (scheduler_) scheduler_->Shutdown(absl::Seconds(10));
  }

  void StartScheduler(int max_queued_jobs = 64, SchedulerOptions options = {}) {
    options.max_queued_jobs = max_queued_jobs;
    scheduler_ = std::make_unique<Scheduler>(jobs_.get(), blobs_.get(), models_.get(), &runner_, &feeds_, options);
    ASSERT_TRUE(scheduler_->Start().ok());
  }
  v1::Job Submit(int priority) {
    v1::Job job;
    job.set_id("job-" + std::to_string(next_id_++));
    job.set_tenant("t");
    job.mutable_spec()->set_model_id(model_id_);
    job.mutable_spec()->set_batch_size(4);
    job.mutable_spec()->set_priority(priority);
    job.mutable_spec()->mutable_data()->mutable_synthetic()->add_sample_shape(3);
    bool created = false;
    v1::Job stored = *jobs_->Create(job, *PlanJob(job.spec(), {}), &created);
    if (scheduler_) scheduler_->Enqueue(stored);
    return stored;
  }
  v1::JobState WaitFor(const std::string& id, std::function<bool(v1::JobState)> done) {
    for (int i = 0; i < 500; ++i) {
      const v1::JobState state = jobs_->Get(id)->state();
      if (done(state)) return state;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "job " << id << " stayed " << v1::JobState_Name(jobs_->Get(id)->state());
    return jobs_->Get(id)->state();
  }
  v1::JobState WaitForEnd(const std::string& id) { return WaitFor(id, IsTerminal); }
  std::vector<std::string> Ran() {
    std::lock_guard<std::mutex> lock(mu_);
    return ran_;
  }

  testing::TempDir tmp_;
  FakeRunner runner_;
  EventHub events_;
  StreamFeeds feeds_{1 << 20};
  std::unique_ptr<store::MetadataStore> metadata_;
  std::unique_ptr<store::LocalBlobStore> blobs_;
  std::unique_ptr<ModelRegistry> models_;
  std::unique_ptr<JobRepository> jobs_;
  std::unique_ptr<Scheduler> scheduler_;
  std::string model_id_;
  Gate gate_;
  int next_id_ = 0;
  std::mutex mu_;
  std::vector<std::string> ran_;  // the jobs the runner was given, in order (scratch is named <job>.attempt-<n>)
};

TEST_F(SchedulerTest, OneDeviceRunsOneJobAtATimeHighestPriorityFirstFifoWithin) {
  StartScheduler();
  const v1::Job first = Submit(0);
  WaitFor(first.id(), [](v1::JobState s) { return s == v1::RUNNING; });
  const v1::Job low = Submit(1), high = Submit(5), high_later = Submit(5);
  EXPECT_EQ(scheduler_->queued(), 3);
  EXPECT_EQ(scheduler_->running(), 1);
  gate_.Open();
  for (const v1::Job& job : {first, low, high, high_later}) EXPECT_EQ(WaitForEnd(job.id()), v1::SUCCEEDED);
  EXPECT_THAT(Ran(), ElementsAre(first.id(), high.id(), high_later.id(), low.id()));
}

TEST_F(SchedulerTest, AJobCancelledWhileQueuedNeverReachesTheRunner) {
  StartScheduler();
  const v1::Job first = Submit(0);
  WaitFor(first.id(), [](v1::JobState s) { return s == v1::RUNNING; });
  const v1::Job waiting = Submit(0);
  ASSERT_EQ(jobs_->Cancel(waiting.id(), "cancelled by request")->state(), v1::CANCELLED);
  scheduler_->Cancel(waiting.id());
  EXPECT_EQ(scheduler_->queued(), 0);
  gate_.Open();
  EXPECT_EQ(WaitForEnd(first.id()), v1::SUCCEEDED);
  const v1::Job next = Submit(0);
  EXPECT_EQ(WaitForEnd(next.id()), v1::SUCCEEDED);
  EXPECT_EQ(Ran().size(), 2u);
  EXPECT_EQ(jobs_->Get(waiting.id())->attempts(), 0);
}

TEST_F(SchedulerTest, ACancelWhileRunningStopsTheRunnerAndEndsTheJobCancelled) {
  StartScheduler();
  const v1::Job job = Submit(0);
  WaitFor(job.id(), [](v1::JobState s) { return s == v1::RUNNING; });
  ASSERT_EQ(jobs_->Cancel(job.id(), "cancelled by request")->state(), v1::CANCELLING);
  scheduler_->Cancel(job.id());
  EXPECT_EQ(WaitForEnd(job.id()), v1::CANCELLED);
  EXPECT_EQ(jobs_->Get(job.id())->error().message(), "cancelled by request");
}

TEST_F(SchedulerTest, TheQueueRefusesPastItsBound) {
  StartScheduler(/*max_queued_jobs=*/2);
  const v1::Job running = Submit(0);
  WaitFor(running.id(), [](v1::JobState s) { return s == v1::RUNNING; });
  EXPECT_TRUE(scheduler_->CheckCapacity().ok());
  Submit(0);
  Submit(0);
  const absl::Status full = scheduler_->CheckCapacity();
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(std::string(full.message()), ::testing::HasSubstr("--max_queued_jobs"));
}

TEST_F(SchedulerTest, ShutdownHandsTheRunningJobToTheNextStartWhichRunsItAgain) {
  StartScheduler();
  const v1::Job job = Submit(0);
  WaitFor(job.id(), [](v1::JobState s) { return s == v1::RUNNING; });
  scheduler_->Shutdown(absl::Seconds(10));
  EXPECT_EQ(jobs_->Get(job.id())->state(), v1::QUEUED);
  EXPECT_FALSE(jobs_->Get(job.id())->has_progress());

  gate_.Open();
  StartScheduler();
  EXPECT_EQ(WaitForEnd(job.id()), v1::SUCCEEDED);
  EXPECT_EQ(jobs_->Get(job.id())->attempts(), 2);
}

TEST_F(SchedulerTest, StartTakesUpWhatADeadProcessLeftRunningWithinMaxAttempts) {
  const v1::Job again = Submit(0);
  ASSERT_TRUE(jobs_->Start(again.id(), "cpu").ok());  // the process that ran it died
  const v1::Job spent = Submit(0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(jobs_->Start(spent.id(), "cpu").ok());
    if (i < 2) {
      ASSERT_TRUE(jobs_->RecoverInterrupted(3).ok());
    }
  }
  gate_.Open();
  StartScheduler();
  EXPECT_EQ(WaitForEnd(again.id()), v1::SUCCEEDED);
  EXPECT_EQ(WaitForEnd(spent.id()), v1::FAILED);
  EXPECT_EQ(Ran().size(), 1u);
}

TEST_F(SchedulerTest, AJobWhoseWorkerStoppedRenewingItsLeaseIsTakenUpAgain) {
  // A worker of another process claimed the job and died: its lease runs out.
  const v1::Job job = Submit(0);
  ASSERT_TRUE(jobs_->Claim("cpu", "gone-worker", absl::ToUnixMillis(absl::Now() + absl::Milliseconds(300)))->has_value());
  gate_.Open();
  SchedulerOptions options;
  options.recover_all_at_start = false;  // as in the cluster: only expired leases
  options.poll_interval = absl::Milliseconds(100);
  StartScheduler(64, options);
  EXPECT_EQ(WaitForEnd(job.id()), v1::SUCCEEDED);
  EXPECT_EQ(jobs_->Get(job.id())->attempts(), 2);
}

TEST_F(SchedulerTest, ARunWhoseLeaseWasTakenAwayStopsAndWritesNothing) {
  SchedulerOptions options;
  options.owner = "me";
  options.lease = absl::Seconds(3);
  StartScheduler(64, options);
  const v1::Job job = Submit(0);
  WaitFor(job.id(), [](v1::JobState s) { return s == v1::RUNNING; });
  // Someone else decided the run was dead (say its lease expired while the store was away)
  // and queued the job again: the lease is not ours any more.
  store::StoredJob stored = *metadata_->ReadJob(job.id());
  stored.job.set_state(v1::QUEUED);
  ASSERT_TRUE(metadata_->CommitJob(stored.job, {}, {}, stored.version).ok());
  // The running copy stops at its next renewal; the job runs again, from the start.
  gate_.Open();
  EXPECT_EQ(WaitForEnd(job.id()), v1::SUCCEEDED);
  EXPECT_EQ(jobs_->Get(job.id())->attempts(), 2);
  EXPECT_EQ(Ran().size(), 2u);
}

}  // namespace
}  // namespace recal::jobs
