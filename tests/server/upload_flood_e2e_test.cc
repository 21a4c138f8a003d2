// Issue 35 as the attacker: tenant A floods the real recal-server (auth on, two tenants)
// with uploads of hostile archives, 6 at once and then 60 at once, each a ~50 KB zip whose
// forward holds more than 500,000 nodes and each with its own digest (so content addressing
// does not fold them into one; tests/fixtures/flood_archives.py), while tenant B uploads a
// fixture model and runs a job. A sampler reads /proc every 10 ms throughout: the server's
// recal-worker children and the host's MemAvailable. Then a flood of uploads that hang up
// while the server inspects them.
//
// The bounds are small so that the test is short on 2 shared cores: 3 inspections on the
// host, A at most 2 (its auth-file max_concurrent_inspections), anyone else 1, a 10 s wait
// for a slot, and memory caps that a small model's worker still fits in.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "tests/server/calls.h"
#include "tests/server/process_stats.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

const std::string kFixtures = RECAL_FIXTURES_DIR;
const std::string kFlood = RECAL_FLOOD_DIR;
const std::string kModel = kFixtures + "/models/bn1d_2d.traced_train.pt";

constexpr int kHostInspections = 3;  // --max_concurrent_inspections
constexpr int kTenantAInspections = 2;  // tenant A's max_concurrent_inspections (auth file)
constexpr int kTenantInspections = 1;  // --tenant_max_concurrent_inspections: tenant B's
constexpr int kJobWorkers = 1;  // --cpu_workers
// --inspection_wait_seconds: longer than an inspection on a loaded machine (measured 2-5 s),
// so that waiting uploads are admitted as slots free, not only refused.
constexpr int kWaitSeconds = 10;
// An inspecting worker's address space (RLIMIT_AS), and a job worker's: the least that the
// workers of the small model start in (measured 2026-12-04: at 2.5 GiB the inspecting worker
// dies of SIGSEGV loading LibTorch; 3 GiB inspect, run and describe the sandbox).
constexpr int64_t kInspectionMemory = int64_t{3} << 30;
constexpr int64_t kJobMemory = int64_t{3} << 30;
// The server, this test's threads and whatever else runs on the machine meanwhile.
constexpr int64_t kMemoryMargin = int64_t{2} << 30;
constexpr int kFirstWave = 6, kSecondWave = 60;

double SecondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Outcome {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  std::string message;
};

class UploadFloodTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < kFirstWave + kSecondWave; ++i) {
      archives_.push_back(ReadBytes(absl::StrCat(kFlood, "/wide_graph_", i, ".pt")));
    }
    a_token_ = NewToken();
    b_token_ = NewToken();
    const std::string auth_file = tmp_.File("auth.txt");
    WriteBytes(auth_file, absl::StrCat(AuthLine(a_token_, "team-a", "submit"), AuthLine(b_token_, "team-b", "submit"),
                                       "tenant team-a max_concurrent_inspections=", kTenantAInspections, "\n"));
    server_ = std::make_unique<ServerProcess>(
        tmp_.File("data"),
        std::vector<std::string>{
            "--auth_file=" + auth_file, "--data_root=" + kFixtures, absl::StrCat("--cpu_workers=", kJobWorkers),
            "--threads_per_worker=1", absl::StrCat("--max_concurrent_inspections=", kHostInspections),
            absl::StrCat("--tenant_max_concurrent_inspections=", kTenantInspections),
            absl::StrCat("--inspection_wait_seconds=", kWaitSeconds),
            absl::StrCat("--inspection_memory_bytes=", kInspectionMemory),
            absl::StrCat("--inspection_memory_total=", kHostInspections * kInspectionMemory),
            absl::StrCat("--job_memory_bytes=", kJobMemory)},
        ServerProcess::Auth::kOpen);
    ASSERT_TRUE(server_->ok()) << server_->log();
  }

  // Uploads archives [from, from + count) as tenant A, all at once; their outcomes in order.
  std::vector<Outcome> FloodAsA(int from, int count) {
    auto stub = server_->Stub(a_token_);
    std::vector<Outcome> outcomes(count);
    std::vector<std::thread> uploads;
    for (int i = 0; i < count; ++i) {
      uploads.emplace_back([&, i] {
        v1::Model model;
        const grpc::Status status = Upload(*stub, archives_[from + i], &model);
        outcomes[i] = {status.error_code(), status.error_message()};
      });
    }
    for (std::thread& upload : uploads) upload.join();
    return outcomes;
  }

  // Each outcome is the graph bound's verdict or a refusal at A's own bound after the wait,
  // never anything else (a hostile archive accepted, the server failing); returns how many
  // were refused by the graph bound.
  int ExpectGraphVerdictOrTenantRefusal(const std::vector<Outcome>& outcomes, const std::string& wave) {
    int graph = 0, waited = 0;
    for (const Outcome& outcome : outcomes) {
      if (outcome.code == grpc::StatusCode::INVALID_ARGUMENT) {
        ++graph;
        EXPECT_THAT(outcome.message, HasSubstr("max_graph_nodes")) << wave;
      } else {
        ++waited;
        EXPECT_EQ(outcome.code, grpc::StatusCode::RESOURCE_EXHAUSTED) << wave << ": " << outcome.message;
        EXPECT_THAT(outcome.message, AllOf(HasSubstr(absl::StrCat("tenant team-a already has ", kTenantAInspections,
                                                                   " inspections running")),
                                           HasSubstr("max_concurrent_inspections in the auth file"),
                                           HasSubstr(absl::StrCat("waited ", kWaitSeconds, "s")),
                                           HasSubstr("Retry the upload later")))
            << wave;
      }
    }
    std::printf("%s: %d refused by the graph bound, %d refused after waiting for a slot\n", wave.c_str(), graph,
                waited);
    // The first kTenantAInspections start at once: the host has room for them.
    EXPECT_GE(graph, kTenantAInspections) << wave;
    return graph;
  }

  // Tenant B's upload of a fixture model and a job on it, begun mid-flood: both must go
  // through. Returns the seconds to the accepted upload and to the SUCCEEDED job.
  std::pair<double, double> UploadAndRunAsB() {
    const auto start = Clock::now();
    auto b = server_->Stub(b_token_);
    v1::Model model;
    const grpc::Status uploaded = Upload(*b, ReadBytes(kModel), &model);
    EXPECT_TRUE(uploaded.ok()) << "tenant B's upload during the flood: " << uploaded.error_message();
    const double upload_seconds = SecondsSince(start);
    grpc::ClientContext context;
    v1::Job job;
    const grpc::Status submitted = b->SubmitJob(&context, NpyJob(model.id(), "data/bn1d_2d.npy", 8), &job);
    EXPECT_TRUE(submitted.ok()) << submitted.error_message();
    const v1::Job done = WaitForState(*b, job.id(), v1::SUCCEEDED, 60);
    EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.error().message();
    return {upload_seconds, SecondsSince(start)};
  }

  // An upload refused at A's bound keeps its staged bytes: finishing it again is enough,
  // and then the graph bound refuses it.
  void ExpectFinishingAgainGetsTheGraphVerdict(const std::string& bytes) {
    auto a = server_->Stub(a_token_);
    grpc::ClientContext context;
    v1::GetUploadStatusRequest request;
    request.set_sha256(Sha256Hex(bytes));
    v1::UploadStatus staged;
    ASSERT_TRUE(a->GetUploadStatus(&context, request, &staged).ok());
    EXPECT_EQ(staged.committed_size(), static_cast<int64_t>(bytes.size()));
    v1::Model model;
    const grpc::Status again = Upload(*a, bytes, &model, /*from=*/bytes.size());
    EXPECT_EQ(again.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << again.error_message();
    EXPECT_THAT(again.error_message(), HasSubstr("max_graph_nodes"));
  }

  int ModelsOfA() {
    grpc::ClientContext context;
    v1::ListModelsResponse models;
    EXPECT_TRUE(server_->Stub(a_token_)->ListModels(&context, v1::ListModelsRequest(), &models).ok());
    return models.models_size();
  }

  int Workers() const { return CountChildren(server_->pid(), "recal-worker"); }

  TempDir tmp_;
  std::vector<std::string> archives_;
  std::string a_token_, b_token_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(UploadFloodTest, OneTenantsFloodOfHostileUploadsIsBoundedAndAnotherTenantsJobStillSucceeds) {
  const int64_t available_at_start = MemAvailableBytes();
  ASSERT_GT(available_at_start, 0);
  std::atomic<int> max_workers{0};
  std::atomic<int64_t> min_available{INT64_MAX};
  PeriodicSampler sampler(std::chrono::milliseconds(10), [&] {
    max_workers.store(std::max(max_workers.load(), Workers()));
    min_available.store(std::min(min_available.load(), MemAvailableBytes()));
  });

  EXPECT_GT(ExpectGraphVerdictOrTenantRefusal(FloodAsA(0, kFirstWave), "6 at once"), kTenantAInspections)
      << "uploads that wait are admitted as A's slots free";

  // 60 at once; B begins once A's inspections run.
  const auto flood_start = Clock::now();
  std::vector<Outcome> second;
  std::thread flood([&] { second = FloodAsA(kFirstWave, kSecondWave); });
  while (Workers() < 1 && SecondsSince(flood_start) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto [b_upload_seconds, b_seconds] = UploadAndRunAsB();
  flood.join();
  const double flood_seconds = SecondsSince(flood_start);
  const int graph = ExpectGraphVerdictOrTenantRefusal(second, "60 at once");
  EXPECT_LT(graph, kSecondWave) << "the wait for a slot is bounded: some of 60 are refused by it";
  std::printf("tenant B: upload accepted in %.2f s, job SUCCEEDED %.2f s after B began; the flood of 60 lasted "
              "%.2f s\n",
              b_upload_seconds, b_seconds, flood_seconds);

  const auto refused = std::find_if(second.begin(), second.end(), [](const Outcome& outcome) {
    return outcome.code == grpc::StatusCode::RESOURCE_EXHAUSTED;
  });
  ASSERT_NE(refused, second.end());
  ExpectFinishingAgainGetsTheGraphVerdict(archives_[kFirstWave + (refused - second.begin())]);
  EXPECT_EQ(ModelsOfA(), 0) << "a hostile archive became a model";

  // Every worker is gone once the calls are answered.
  const auto settle = Clock::now();
  while (Workers() > 0 && SecondsSince(settle) < 10) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(Workers(), 0);
  sampler.Stop();

  // At most the host's inspections and the job's worker at once, whatever A sends; the
  // sampler saw A's inspections run (it is not blind).
  EXPECT_LE(max_workers.load(), kHostInspections + kJobWorkers);
  EXPECT_GE(max_workers.load(), kTenantAInspections);
  // Each worker's address space is capped, so together they cannot take more than the caps.
  const int64_t caps = kHostInspections * kInspectionMemory + kJobWorkers * kJobMemory;
  const int64_t floor = available_at_start - caps - kMemoryMargin;
  EXPECT_GE(min_available.load(), floor);
  std::printf("recal-worker processes at once: at most %d (bound %d); MemAvailable %.2f GiB at start, least %.2f "
              "GiB (floor %.2f GiB: start - %.1f GiB of caps - %.1f GiB margin)\n",
              max_workers.load(), kHostInspections + kJobWorkers, available_at_start / 1073741824.0,
              min_available.load() / 1073741824.0, floor / 1073741824.0, caps / 1073741824.0,
              kMemoryMargin / 1073741824.0);

  EXPECT_EQ(server_->Health(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// As the attacker who hangs up: 20 uploads whose client goes away right after the last byte,
// while the server inspects them or waits to. Their workers stay within the bounds and are
// all reaped, and A's slots come back: its next upload gets the graph verdict, not a wait.
TEST_F(UploadFloodTest, UploadsThatHangUpMidInspectionLeaveNoWorkerAndNoSlotBehind) {
  constexpr int kHangUps = 20;
  std::atomic<int> max_workers{0};
  PeriodicSampler sampler(std::chrono::milliseconds(10),
                          [&] { max_workers.store(std::max(max_workers.load(), Workers())); });
  auto a = server_->Stub(a_token_);
  std::vector<std::thread> uploads;
  for (int i = 0; i < kHangUps; ++i) uploads.emplace_back([&, i] { UploadAndHangUp(*a, archives_[i]); });
  for (std::thread& upload : uploads) upload.join();
  // Past every abandoned call's wait for a slot, and past the inspections it let start.
  std::this_thread::sleep_for(std::chrono::seconds(kWaitSeconds) + std::chrono::milliseconds(500));
  const auto settle = Clock::now();
  while (Workers() > 0 && SecondsSince(settle) < 20) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(Workers(), 0);
  sampler.Stop();
  EXPECT_LE(max_workers.load(), kHostInspections + kJobWorkers);
  EXPECT_GE(max_workers.load(), 1);

  v1::Model model;
  const grpc::Status next = Upload(*a, archives_[kHangUps], &model);
  EXPECT_EQ(next.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << next.error_message();
  EXPECT_THAT(next.error_message(), HasSubstr("max_graph_nodes"));
  EXPECT_EQ(ModelsOfA(), 0);
  EXPECT_EQ(server_->Health(), grpc::health::v1::HealthCheckResponse::SERVING);
}

}  // namespace
}  // namespace recal::testing
