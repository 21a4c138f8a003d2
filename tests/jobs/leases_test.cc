// A run's lease heartbeat over a real SQLite store: a lease taken back by the store is lost
// (the run stops and writes nothing), while the lease the run's own end released is not.
#include "server/jobs/leases.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/time/clock.h"
#include "tests/jobs/job_store_fixture.h"

namespace recal::jobs {
namespace {

class LeaseHeartbeatTest : public JobStoreTest {
 protected:
  void SetUp() override {
    JobStoreTest::SetUp();
    options_.owner = "this-process";
    options_.lease = absl::Milliseconds(60);  // renewed every 20 ms
    leases_ = std::make_unique<Leases>(jobs_.get(), options_, &wake_, stopping_);
    Create("job");
    absl::StatusOr<std::optional<v1::Job>> claimed = leases_->Claim("cpu", store::ClaimKind::kRun);
    ASSERT_TRUE(claimed.ok() && claimed->has_value()) << claimed.status();
  }

  // Long enough for several renewals.
  static void SeveralBeats() { std::this_thread::sleep_for(std::chrono::milliseconds(150)); }

  SchedulerOptions options_;
  WakeSignal wake_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<Leases> leases_;
  RunFlags flags_;
};

TEST_F(LeaseHeartbeatTest, ALeaseTheStoreTookBackIsLostAndStopsTheRun) {
  LeaseHeartbeat heartbeat(*leases_, "job", flags_);
  SeveralBeats();
  ASSERT_FALSE(flags_.lease_lost) << "renewed in time";
  // As the reaper of another process would, once the lease seemed to have ended.
  ASSERT_TRUE(jobs_->RecoverExpired(absl::ToUnixMillis(absl::Now() + absl::Hours(1)), 3).ok());
  SeveralBeats();
  EXPECT_TRUE(flags_.lease_lost);
  EXPECT_TRUE(flags_.cancel);
}

TEST_F(LeaseHeartbeatTest, TheLeaseReleasedByTheRunsOwnEndIsNotCalledLost) {
  LeaseHeartbeat heartbeat(*leases_, "job", flags_);
  SeveralBeats();
  absl::StatusOr<v1::Job> ended =
      heartbeat.Ending([&] { return jobs_->Succeed("job", {}, v1::RunReport(), options_.owner); });
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state(), v1::SUCCEEDED);
  SeveralBeats();  // the heartbeat outlives the end, as in Scheduler::RunJob
  EXPECT_FALSE(flags_.lease_lost);
  EXPECT_FALSE(flags_.cancel);
}

TEST_F(LeaseHeartbeatTest, AnEndTheStoreRefusedLeavesTheHeartbeatRenewing) {
  LeaseHeartbeat heartbeat(*leases_, "job", flags_);
  absl::StatusOr<v1::Job> refused =
      heartbeat.Ending([] { return absl::StatusOr<v1::Job>(absl::UnavailableError("the store restarts")); });
  ASSERT_FALSE(refused.ok());
  SeveralBeats();
  EXPECT_FALSE(flags_.lease_lost);
  // Still this process's: its renewals went on.
  EXPECT_EQ(*jobs_->Renew("job", options_.owner, absl::ToUnixMillis(absl::Now() + absl::Seconds(1))), v1::RUNNING);
}

}  // namespace
}  // namespace recal::jobs
