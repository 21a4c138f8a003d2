// The cluster mode end to end: a throwaway PostgreSQL, two api replicas and two workers (each
// its own process and local data dir, blobs on one shared directory). The api replicas cannot
// start a recal-worker (their --worker_binary does not exist): the workers inspect their
// uploads (ClusterInspectionTest: the same verdicts as --role=all, an attacker at the internal
// inspection, no worker up). Jobs submitted through
// either replica run on both workers, a watch through the other replica sees them through, and
// a worker killed with SIGKILL mid-job loses the job to the other worker once its lease runs
// out: it completes there as attempt 2; a worker started mid-run leaves the running job alone
// (it takes back expired leases only); a worker frozen past its lease and woken leaves the
// attempt that took its job over alone. The database cut off, and PostgreSQL itself crashed
// (SIGKILL) and started again mid-run: every job succeeds once, and no process is restarted.
// Client-stream jobs (ClusterStreamTest): pushes through either replica are relayed to the
// worker process running the job; its internal endpoint refuses callers without the cluster
// secret; a worker killed mid-stream fails the job (pushed batches are not replayable).
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "recal/internal/v1/inspection.grpc.pb.h"
#include "recal/internal/v1/relay.grpc.pb.h"
#include "server/data/batch_source.h"
#include "tests/engine/test_util.h"
#include "tests/server/calls.h"
#include "tests/server/server_process.h"
#include "tests/store/postgres_server.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

const std::string kFixtures = RECAL_FIXTURES_DIR;

using Health = grpc::health::v1::HealthCheckResponse;

Health::ServingStatus HealthOf(const ServerProcess& process) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  Health response;
  grpc::health::v1::Health::NewStub(process.Channel(""))
      ->Check(&context, grpc::health::v1::HealthCheckRequest(), &response)
      .IgnoreError();
  return response.status();
}

// Polls the health of every process until each has said `status` at least once, for up to
// `seconds`; the names of those that never did.
std::vector<std::string> AwaitHealth(const std::vector<std::pair<std::string, const ServerProcess*>>& processes,
                                     Health::ServingStatus status, double seconds) {
  std::set<std::string> waiting;
  for (const auto& [name, process] : processes) waiting.insert(name);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!waiting.empty() && std::chrono::steady_clock::now() < deadline) {
    for (const auto& [name, process] : processes) {
      if (waiting.count(name) > 0 && HealthOf(*process) == status) waiting.erase(name);
    }
    if (!waiting.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return {waiting.begin(), waiting.end()};
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto postgres = PostgresServer::Shared();
    if (absl::IsNotFound(postgres.status())) GTEST_SKIP() << postgres.status().message();
    ASSERT_TRUE(postgres.ok()) << postgres.status();
    auto uri = (*postgres)->NewDatabase();
    ASSERT_TRUE(uri.ok()) << uri.status();
    uri_ = *uri;
    token_ = NewToken();
    std::ofstream(tmp_.File("auth.txt")) << AuthLine(token_, "default", "admin") << extra_auth_;
    // The secret every api replica needs (its uploads are inspected by the workers) and that
    // admits it to the workers' internal endpoints.
    std::ofstream(tmp_.File("cluster-secret")) << NewToken() << "\n";
    shared_ = {"--store=" + *uri, "--blobs=file:" + tmp_.File("shared-blobs"), "--data_root=" + kFixtures,
               "--auth_file=" + tmp_.File("auth.txt"), "--lease_seconds=" + std::to_string(lease_seconds_),
               "--internal_token_file=" + tmp_.File("cluster-secret"), "--internal_listen=127.0.0.1:0"};
    shared_.insert(shared_.end(), extra_flags_.begin(), extra_flags_.end());
    for (const char* name : {"api-a", "api-b"}) apis_.push_back(Start(name, "api"));
    for (const char* name : {"worker-1", "worker-2"}) workers_.push_back(Start(name, "worker"));
  }
  std::unique_ptr<ServerProcess> Start(const std::string& name, const std::string& role) {
    std::vector<std::string> flags = shared_;
    flags.push_back("--role=" + role);
    const std::vector<std::string>& own = role == "worker" ? worker_flags_ : api_flags_;
    flags.insert(flags.end(), own.begin(), own.end());
    // Provably no recal-worker on an api replica, as in the api image.
    if (role == "api") flags.push_back("--worker_binary=" + tmp_.File("no-recal-worker-here"));
    auto process = std::make_unique<ServerProcess>(tmp_.File(name), flags, ServerProcess::Auth::kOpen);
    EXPECT_TRUE(process->ok()) << name << ": " << process->log();
    return process;
  }
  std::unique_ptr<v1::Recal::Stub> Api(int i) { return apis_[i]->Stub(token_); }
  // The internal endpoint worker `i` advertised (from its log).
  std::string InternalAddress(int i) {
    std::smatch match;
    const std::string log = workers_[i]->log();
    if (!std::regex_search(log, match, std::regex("advertised=(\\S+)"))) return "";
    return match[1];
  }
  // Which worker's log says it started `job_id` (attempt `attempt`); -1 if none.
  int WorkerThatStarted(const std::string& job_id, int attempt) {
    const std::regex started("job started job_id=" + job_id + " device=\\S+ attempt=" + std::to_string(attempt));
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (std::regex_search(workers_[i]->log(), started)) return static_cast<int>(i);
    }
    return -1;
  }
  // The pid of worker `i`'s recal-server (found by its data dir), 0 if none.
  pid_t WorkerPid(int i) {
    const std::string data_dir = std::string("--data_dir=") + tmp_.File(i == 0 ? "worker-1" : "worker-2");
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string name = entry.path().filename();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream file(entry.path() / "cmdline", std::ios::binary);
      std::vector<std::string> args;
      for (std::string arg; std::getline(file, arg, '\0');) args.push_back(arg);
      if (!args.empty() && absl::EndsWith(args[0], "recal-server") &&
          std::find(args.begin(), args.end(), data_dir) != args.end()) {
        return static_cast<pid_t>(std::stoi(name));
      }
    }
    return 0;
  }
  // Submits `request` through replica 0 and waits until a worker has started it (attempt 1).
  void SubmitUntilRunning(const v1::SubmitJobRequest& request, v1::Job* job, int* running_on) {
    grpc::ClientContext context;
    ASSERT_TRUE(Api(0)->SubmitJob(&context, request, job).ok());
    WaitForState(*Api(1), job->id(), v1::RUNNING, 60);
    for (int i = 0; i < 100 && *running_on < 0; ++i) {
      *running_on = WorkerThatStarted(job->id(), 1);
      if (*running_on < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_GE(*running_on, 0);
  }

  // Cuts the cluster off its database (no new connections, the open ones ended) or lets it back.
  void SetDatabaseReachable(bool reachable) {
    const std::string database = uri_.substr(uri_.rfind('/') + 1);
    const std::string maintenance = uri_.substr(0, uri_.rfind('/') + 1) + "postgres";
    std::string sql = "ALTER DATABASE \"" + database + "\" ALLOW_CONNECTIONS " + (reachable ? "true" : "false");
    if (!reachable) {
      sql += "; SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '" + database + "'";
    }
    ASSERT_TRUE(PostgresServer::Execute(maintenance, sql).ok());
  }

  // Every process of the cluster, for health checks.
  std::vector<std::pair<std::string, const ServerProcess*>> Processes() const {
    return {{"api-a", apis_[0].get()}, {"api-b", apis_[1].get()}, {"worker-1", workers_[0].get()},
            {"worker-2", workers_[1].get()}};
  }
  // Every event of `id` through api replica `api`: one summary and one SUCCEEDED when it ran
  // to completion exactly once, whatever was retried on the way.
  void ExpectSucceededOnce(int api, const std::string& id) {
    int summaries = 0, succeeded = 0;
    for (const v1::JobEvent& event : Watch(*Api(api), id)) {
      summaries += event.has_summary();
      succeeded += event.kind_case() == v1::JobEvent::kState && event.state() == v1::SUCCEEDED;
    }
    EXPECT_EQ(summaries, 1) << id;
    EXPECT_EQ(succeeded, 1) << id;
  }

  int lease_seconds_ = 3;
  std::vector<std::string> extra_flags_;  // for every process, set before SetUp
  std::vector<std::string> worker_flags_, api_flags_;  // for the workers, the api replicas
  std::string extra_auth_;                // auth-file lines beside the admin's
  TempDir tmp_;
  std::string uri_;
  std::string token_;
  std::vector<std::string> shared_;
  std::vector<std::unique_ptr<ServerProcess>> apis_, workers_;
};

TEST_F(ClusterTest, JobsFromEitherReplicaRunOnBothWorkersAndAKilledWorkersJobFinishesOnTheOther) {
  v1::Model small, resnet;
  ASSERT_TRUE(Upload(*Api(0), ReadBytes(kFixtures + "/models/bn1d_2d.traced_train.pt"), &small).ok());
  ASSERT_TRUE(Upload(*Api(1), ReadBytes(kFixtures + "/models/resnet18.traced_eval.pt"), &resnet).ok());

  // 20 jobs from 4 concurrent clients, two on each replica.
  std::vector<std::string> ids;
  std::mutex ids_mu;
  std::vector<std::thread> clients;
  for (int client = 0; client < 4; ++client) {
    clients.emplace_back([&, client] {
      auto stub = Api(client % 2);
      for (int i = 0; i < 5; ++i) {
        grpc::ClientContext context;
        v1::Job job;
        const grpc::Status submitted = stub->SubmitJob(&context, NpyJob(small.id(), "data/bn1d_2d.npy", 8), &job);
        EXPECT_TRUE(submitted.ok()) << submitted.error_message();
        std::lock_guard<std::mutex> lock(ids_mu);
        if (submitted.ok()) ids.push_back(job.id());
      }
    });
  }
  for (std::thread& client : clients) client.join();
  ASSERT_EQ(ids.size(), 20u);
  // A watch through the replica that did not take the job sees it to the end.
  std::vector<v1::JobEvent> events = Watch(*Api(1), ids[0]);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED);
  std::set<int> workers_used;
  for (const std::string& id : ids) {
    EXPECT_EQ(WaitForState(*Api(0), id, v1::SUCCEEDED, 120).state(), v1::SUCCEEDED);
    workers_used.insert(WorkerThatStarted(id, 1));
  }
  EXPECT_EQ(workers_used, (std::set<int>{0, 1})) << "both workers take jobs, and only they";

  // A longer job; its worker dies mid-run.
  v1::SubmitJobRequest long_job = LongJob(resnet.id());
  long_job.mutable_spec()->mutable_options()->set_max_batches(24);
  v1::Job job;
  int running_on = -1;
  ASSERT_NO_FATAL_FAILURE(SubmitUntilRunning(long_job, &job, &running_on));
  const auto killed_at = std::chrono::steady_clock::now();
  workers_[running_on]->Kill();
  const v1::Job done = WaitForState(*Api(1), job.id(), v1::SUCCEEDED, 180);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.error().message();
  EXPECT_EQ(done.attempts(), 2);
  EXPECT_EQ(WorkerThatStarted(job.id(), 2), 1 - running_on);
  // Taken up within the lease (3 s) and the reaper's poll, not after a restart.
  const double taken_up = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(taken_up, 120) << "the run itself included";
  grpc::Status downloaded;
  EXPECT_FALSE(Download(*Api(0), job.id(), v1::BN_BUFFERS, &downloaded).empty());
  EXPECT_TRUE(downloaded.ok()) << downloaded.error_message();

  // A worker serves no API.
  grpc::ClientContext c2;
  v1::ListJobsResponse listed;
  EXPECT_EQ(workers_[1 - running_on]->Stub(token_)->ListJobs(&c2, v1::ListJobsRequest(), &listed).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

// A worker that starts (a restarted container) takes back only the jobs whose lease has run
// out: the job another worker is running, its lease renewed, stays that worker's. (Workers
// once took back every running job at start, stopping the other workers' runs:
// scripts/compose_check.sh found it.)
TEST_F(ClusterTest, AWorkerThatStartsLeavesTheJobsOfLiveWorkersAlone) {
  v1::Model resnet;
  ASSERT_TRUE(Upload(*Api(0), ReadBytes(kFixtures + "/models/resnet18.traced_eval.pt"), &resnet).ok());
  v1::SubmitJobRequest request = LongJob(resnet.id());
  request.mutable_spec()->mutable_options()->set_max_batches(40);
  v1::Job job;
  int running_on = -1;
  ASSERT_NO_FATAL_FAILURE(SubmitUntilRunning(request, &job, &running_on));
  workers_.push_back(Start("worker-3", "worker"));
  ASSERT_TRUE(workers_.back()->ok());
  EXPECT_THAT(workers_.back()->log(), ::testing::Not(::testing::HasSubstr("re-queued at start-up")));
  const v1::Job done = WaitForState(*Api(1), job.id(), v1::SUCCEEDED, 180);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.error().message();
  EXPECT_EQ(done.attempts(), 1);
  EXPECT_EQ(WorkerThatStarted(job.id(), 2), -1);
}

// A worker frozen (SIGSTOP) past its lease loses its job to the other worker (attempt 2).
// Woken, it abandons its run, and removing its scratch files leaves the attempt that took
// over alone. (Both once used one scratch directory per job on the shared blob store: the
// late cleanup deleted the second attempt's files, and it failed.)
TEST_F(ClusterTest, AWorkerWokenPastItsLeaseLeavesTheAttemptThatTookItsJobOverAlone) {
  v1::Model resnet;
  ASSERT_TRUE(Upload(*Api(0), ReadBytes(kFixtures + "/models/resnet18.traced_eval.pt"), &resnet).ok());
  v1::SubmitJobRequest request = LongJob(resnet.id());
  request.mutable_spec()->mutable_options()->set_max_batches(48);
  v1::Job job;
  int frozen = -1;
  ASSERT_NO_FATAL_FAILURE(SubmitUntilRunning(request, &job, &frozen));
  const pid_t frozen_pid = WorkerPid(frozen);
  ASSERT_GT(frozen_pid, 0);
  ASSERT_EQ(::kill(frozen_pid, SIGSTOP), 0);
  int took_over = -1;
  for (int i = 0; i < 600 && took_over < 0; ++i) {
    took_over = WorkerThatStarted(job.id(), 2);
    if (took_over < 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(::kill(frozen_pid, SIGCONT), 0);
  ASSERT_EQ(took_over, 1 - frozen) << "the job was not taken over within 60 s of its worker freezing";
  for (int i = 0; i < 300 && !absl::StrContains(workers_[frozen]->log(), "job run abandoned"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_THAT(workers_[frozen]->log(), ::testing::HasSubstr("job run abandoned"));
  const v1::Job done = WaitForState(*Api(1), job.id(), v1::SUCCEEDED, 180);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.error().message();
  EXPECT_EQ(done.attempts(), 2);
  EXPECT_EQ(WorkerThatStarted(job.id(), 3), -1);
  grpc::Status downloaded;
  EXPECT_FALSE(Download(*Api(0), job.id(), v1::MODEL, &downloaded).empty());
  EXPECT_TRUE(downloaded.ok()) << downloaded.error_message();
}

TEST_F(ClusterTest, AShardedJobRunsOnBothWorkersAndAKilledWorkersShardIsRedoneAlone) {
  v1::Model resnet;
  ASSERT_TRUE(Upload(*Api(0), ReadBytes(kFixtures + "/models/resnet18.traced_eval.pt"), &resnet).ok());
  v1::SubmitJobRequest request = LongJob(resnet.id());
  request.mutable_spec()->mutable_options()->set_max_batches(16);
  request.mutable_spec()->set_shards(2);
  grpc::ClientContext context;
  v1::Job job;
  ASSERT_TRUE(Api(0)->SubmitJob(&context, request, &job).ok());
  const std::string shard0 = job.id() + "-s0", shard1 = job.id() + "-s1";
  // Both shards start, one on each worker (a worker runs one task at a time).
  int shard0_on = -1, shard1_on = -1;
  for (int i = 0; i < 600 && (shard0_on < 0 || shard1_on < 0); ++i) {
    shard0_on = WorkerThatStarted(shard0, 1);
    shard1_on = WorkerThatStarted(shard1, 1);
    if (shard0_on < 0 || shard1_on < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(shard0_on, 0);
  ASSERT_GE(shard1_on, 0);
  ASSERT_NE(shard0_on, shard1_on);
  workers_[shard1_on]->Kill();
  // Shard 1 runs again on the other worker once its lease has run out; shard 0 is not redone.
  const v1::Job done = WaitForState(*Api(1), job.id(), v1::SUCCEEDED, 180);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.error().message();
  grpc::ClientContext c0, c1;
  v1::GetJobRequest get;
  v1::Job s0, s1;
  get.set_id(shard0);
  ASSERT_TRUE(Api(1)->GetJob(&c0, get, &s0).ok());
  get.set_id(shard1);
  ASSERT_TRUE(Api(1)->GetJob(&c1, get, &s1).ok());
  EXPECT_EQ(s0.attempts(), 1);
  EXPECT_EQ(s1.attempts(), 2);
  EXPECT_EQ(WorkerThatStarted(shard1, 2), shard0_on);
  EXPECT_EQ(done.progress().batches_done(), 16);

  // The same batches unsharded give the same statistics (float32 buffers: an ulp apart).
  request.mutable_spec()->set_shards(0);
  grpc::ClientContext c2;
  v1::Job whole;
  ASSERT_TRUE(Api(1)->SubmitJob(&c2, request, &whole).ok());
  ASSERT_EQ(WaitForState(*Api(0), whole.id(), v1::SUCCEEDED, 180).state(), v1::SUCCEEDED);
  const std::string sharded_path = tmp_.File("sharded.safetensors"), whole_path = tmp_.File("whole.safetensors");
  std::ofstream(sharded_path, std::ios::binary) << Download(*Api(0), job.id(), v1::BN_BUFFERS);
  std::ofstream(whole_path, std::ios::binary) << Download(*Api(0), whole.id(), v1::BN_BUFFERS);
  EXPECT_LE(engine::testing::WorstRelativeError(engine::testing::ReadSafetensors(sharded_path),
                                                engine::testing::ReadSafetensors(whole_path)),
            1e-6);
}

TEST_F(ClusterTest, ADatabaseOutageAndADeadReplicaLoseNoJobAndRunNoneTwice) {
  v1::Model small;
  ASSERT_TRUE(Upload(*Api(0), ReadBytes(kFixtures + "/models/bn1d_2d.traced_train.pt"), &small).ok());
  std::vector<std::string> ids;
  for (int i = 0; i < 10; ++i) {
    grpc::ClientContext context;
    v1::Job job;
    ASSERT_TRUE(Api(i % 2)->SubmitJob(&context, NpyJob(small.id(), "data/bn1d_2d.npy", 8), &job).ok());
    ids.push_back(job.id());
  }
  // The database goes away mid-run (a job is running) for longer than a lease, then comes back.
  WaitForState(*Api(0), ids[0], v1::RUNNING, 60);
  SetDatabaseReachable(false);
  std::this_thread::sleep_for(std::chrono::seconds(5));
  SetDatabaseReachable(true);
  // The outage was felt (workers said NOT_SERVING while it lasted).
  bool felt = false;
  for (const auto& worker : workers_) felt = felt || worker->log().find("the store does not answer") != std::string::npos;
  EXPECT_TRUE(felt);
  // An api replica dies; clients carry on through the other.
  apis_[0]->Kill();
  int retried = 0;
  for (const std::string& id : ids) {
    const v1::Job job = WaitForState(*Api(1), id, v1::SUCCEEDED, 180);
    EXPECT_EQ(job.state(), v1::SUCCEEDED) << id << ": " << job.error().message();
    ExpectSucceededOnce(1, id);
    retried += job.attempts() > 1;
  }
  std::cout << retried << " of " << ids.size() << " jobs ran again after the outage\n";
}

// A lease longer than the restart below, so that the job running across it keeps its lease
// and finishes where it runs; the outage longer than a lease is the test above.
class ClusterRestartTest : public ClusterTest {
 protected:
  ClusterRestartTest() { lease_seconds_ = 10; }
};

TEST_F(ClusterRestartTest, PostgresCrashedAndRestartedMidRunLosesNoJobAndRunsNoneTwice) {
  PostgresServer* postgres = *PostgresServer::Shared();  // SetUp skipped or failed otherwise
  v1::Model small, mobilenet;
  ASSERT_TRUE(Upload(*Api(0), ReadBytes(kFixtures + "/models/bn1d_2d.traced_train.pt"), &small).ok());
  ASSERT_TRUE(Upload(*Api(1), ReadBytes(kFixtures + "/models/mobilenet_v2.traced_train.pt"), &mobilenet).ok());
  // A job that runs for a while (it must outlast the outage), then small ones behind it.
  v1::SubmitJobRequest long_request = LongJob(mobilenet.id());
  long_request.mutable_spec()->mutable_options()->set_max_batches(24);
  long_request.mutable_spec()->set_priority(1);
  grpc::ClientContext c1;
  v1::Job long_job;
  ASSERT_TRUE(Api(1)->SubmitJob(&c1, long_request, &long_job).ok());
  std::vector<std::string> ids;
  auto submit_small = [&](int n) {
    for (int i = 0; i < n; ++i) {
      grpc::ClientContext context;
      v1::Job job;
      const grpc::Status submitted = Api(i % 2)->SubmitJob(&context, NpyJob(small.id(), "data/bn1d_2d.npy", 8), &job);
      EXPECT_TRUE(submitted.ok()) << submitted.error_message();
      if (submitted.ok()) ids.push_back(job.id());
    }
  };
  submit_small(8);
  // Mid-run: the long job has reported progress.
  const v1::Job running = PollJob(
      *Api(0), long_job.id(), [](const v1::Job& job) { return job.progress().batches_done() >= 1; }, 120);
  ASSERT_EQ(running.state(), v1::RUNNING);
  ASSERT_LT(running.progress().batches_done(), running.progress().batches_total());

  // PostgreSQL crashes: every connection breaks, and nothing answers on its port.
  const auto crashed_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(postgres->Stop(PostgresServer::Shutdown::kCrash).ok());
  grpc::StatusCode during = grpc::StatusCode::OK;
  for (int i = 0; i < 50 && during == grpc::StatusCode::OK; ++i) {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_id(long_job.id());
    v1::Job job;
    during = Api(i % 2)->GetJob(&context, request, &job).error_code();
    if (during == grpc::StatusCode::OK) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(during, grpc::StatusCode::UNAVAILABLE) << "clients are told to retry";
  const std::vector<std::string> still_serving = AwaitHealth(Processes(), Health::NOT_SERVING, 10);
  EXPECT_THAT(still_serving, ::testing::IsEmpty()) << "every process says NOT_SERVING while the store is down";
  // Started again, after crash recovery, on the same port and data directory.
  const absl::Status started = postgres->Start();
  ASSERT_TRUE(started.ok()) << started;
  const double outage = SecondsSince(crashed_at);
  const auto back_at = std::chrono::steady_clock::now();
  EXPECT_THAT(AwaitHealth(Processes(), Health::SERVING, 15), ::testing::IsEmpty())
      << "every process serves again, none restarted";
  const double recovered_in = SecondsSince(back_at);
  for (const auto& [name, process] : Processes()) {
    EXPECT_THAT(process->log(), ::testing::HasSubstr("the store answers again")) << name;
  }
  // Both replicas take new jobs.
  submit_small(2);

  // Every job succeeds, once; the one that ran across the restart kept its lease and its run.
  const v1::Job done = WaitForState(*Api(1), long_job.id(), v1::SUCCEEDED, 180);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.error().message();
  EXPECT_EQ(done.attempts(), 1) << "the job running across the restart ran again";
  ExpectSucceededOnce(0, long_job.id());
  int retried = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const v1::Job job = WaitForState(*Api(i % 2), ids[i], v1::SUCCEEDED, 180);
    EXPECT_EQ(job.state(), v1::SUCCEEDED) << ids[i] << ": " << job.error().message();
    ExpectSucceededOnce(1 - static_cast<int>(i % 2), ids[i]);
    if (job.attempts() == 1) continue;
    // Correct (it succeeded once) but worth knowing why: what the workers said of it.
    ++retried;
    for (const auto& worker : workers_) {
      std::istringstream log(worker->log());
      for (std::string line; std::getline(log, line);) {
        if (line.find(ids[i]) != std::string::npos) std::cout << "  " << line << "\n";
      }
    }
  }
  EXPECT_EQ(ids.size(), 10u);
  // A run that ended while the store was away kept its lease and stored its end once the
  // store was back, rather than being run again after the lease.
  int stored_late = 0;
  for (const auto& worker : workers_) {
    const std::string log = worker->log();
    EXPECT_THAT(log, ::testing::Not(::testing::HasSubstr("job end not stored job_id")));
    for (size_t at = 0; (at = log.find("job end not stored yet", at)) != std::string::npos; ++at) ++stored_late;
  }

  // A clean restart too (fast shutdown: every session ended by the server): the first calls
  // after it, on connections that broke meanwhile, reconnect and succeed.
  ASSERT_TRUE(postgres->Restart(PostgresServer::Shutdown::kFast).ok());
  for (int api = 0; api < 2; ++api) {
    grpc::ClientContext context;
    v1::Job job;
    const grpc::Status submitted = Api(api)->SubmitJob(&context, NpyJob(small.id(), "data/bn1d_2d.npy", 8), &job);
    ASSERT_TRUE(submitted.ok()) << submitted.error_message();
    EXPECT_EQ(WaitForState(*Api(1 - api), job.id(), v1::SUCCEEDED, 60).state(), v1::SUCCEEDED);
  }
  std::cout << "PostgreSQL down " << outage << " s; all four processes SERVING " << recovered_in
            << " s after it was back; " << stored_late << " runs ended during the outage and were stored after it; "
            << retried << " of " << ids.size() << " small jobs ran again\n";
}

// Uploads to api replicas that cannot start a recal-worker, inspected by the worker processes.
class ClusterInspectionTest : public ClusterTest {
 protected:
  // Entries the workers' inspections left in the shared blob store's scratch directory.
  std::vector<std::string> InspectionScratch() const {
    std::vector<std::string> left;
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(tmp_.File("shared-blobs") + "/tmp", error)) {
      if (absl::StartsWith(entry.path().filename().string(), "inspect-")) left.push_back(entry.path().string());
    }
    return left;
  }
  // A call on worker `i`'s internal inspection as an attacker makes it.
  grpc::Status InspectDirectly(int i, const std::string& secret, int64_t size, const std::string& bytes) {
    auto stub = internal::v1::ModelInspection::NewStub(
        grpc::CreateChannel(InternalAddress(i), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    if (!secret.empty()) context.AddMetadata("x-recal-cluster-secret", secret);
    internal::v1::InspectModelResponse response;
    auto writer = stub->InspectModel(&context, &response);
    internal::v1::InspectModelRequest message;
    message.set_size(size);
    if (writer->Write(message)) {
      message.set_chunk(bytes);
      writer->Write(message);
    }
    writer->WritesDone();
    return writer->Finish();
  }
};

TEST_F(ClusterInspectionTest, WorkersInspectTheReplicasUploadsWithTheVerdictsOfRoleAllAndTheModelsRun) {
  for (const auto& api : apis_) {
    EXPECT_THAT(api->log(), ::testing::HasSubstr("this process starts no recal-worker"));
    EXPECT_THAT(api->log(), ::testing::Not(::testing::HasSubstr("jobs run in sandboxed workers")));
  }
  // The same archives through one process that inspects them itself.
  ServerProcess all(tmp_.File("all"), {"--data_root=" + kFixtures});
  ASSERT_TRUE(all.ok()) << all.log();

  const std::string bytes = ReadBytes(kFixtures + "/models/bn1d_2d.traced_train.pt");
  v1::Model inspected, locally;
  const grpc::Status uploaded = Upload(*Api(0), bytes, &inspected);
  ASSERT_TRUE(uploaded.ok()) << uploaded.error_message();
  ASSERT_TRUE(Upload(*all.Stub(), bytes, &locally).ok());
  ASSERT_GT(inspected.layers_size(), 0);
  ASSERT_EQ(inspected.layers_size(), locally.layers_size());
  for (int i = 0; i < inspected.layers_size(); ++i) {
    EXPECT_EQ(inspected.layers(i).SerializeAsString(), locally.layers(i).SerializeAsString()) << i;
  }
  ASSERT_EQ(inspected.inputs_size(), 1);  // the traced forward's x: the input contract comes through the relay
  EXPECT_EQ(inspected.inputs(0).SerializeAsString(), locally.inputs(0).SerializeAsString());
  EXPECT_TRUE(absl::StrContains(workers_[0]->log() + workers_[1]->log(), "inspected an upload for an api replica"));

  // Hostile archives: refused with the very code and message a local inspection gives.
  const std::string hostile = kFixtures + "/hostile/", crafted = std::string(RECAL_CRAFTED_DIR) + "/";
  for (const std::string& path : {hostile + "reads_file.pt", hostile + "exploding_graph.pt",
                                  crafted + "truncated_weight_200000.pt", crafted + "nested_ifs.pt"}) {
    v1::Model refused;
    const grpc::Status remote = Upload(*Api(1), ReadBytes(path), &refused);
    const grpc::Status local = Upload(*all.Stub(), ReadBytes(path), &refused);
    EXPECT_EQ(local.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << path << ": " << local.error_message();
    EXPECT_EQ(remote.error_code(), local.error_code()) << path << ": " << remote.error_message();
    EXPECT_EQ(remote.error_message(), local.error_message()) << path;
  }
  EXPECT_FALSE(std::filesystem::exists(kFixtures + "/hostile/written.pt"));
  EXPECT_THAT(InspectionScratch(), ::testing::IsEmpty()) << "received archives are removed";

  // The model the workers accepted runs.
  grpc::ClientContext context;
  v1::Job job;
  ASSERT_TRUE(Api(1)->SubmitJob(&context, NpyJob(inspected.id(), "data/bn1d_2d.npy", 8), &job).ok());
  const v1::Job done = WaitForState(*Api(0), job.id(), v1::SUCCEEDED, 120);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.error().message();
}

TEST_F(ClusterInspectionTest, TheInternalInspectionRefusesCallersWithoutTheSecretAndArchivesOverTheLimit) {
  const std::string model = ReadBytes(kFixtures + "/models/bn1d_2d.traced_train.pt");
  for (const std::string& secret : {std::string(), NewToken(), token_}) {
    const grpc::Status status = InspectDirectly(0, secret, static_cast<int64_t>(model.size()), model);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "secret: '" << secret << "'";
  }
  EXPECT_THAT(workers_[0]->log(), ::testing::HasSubstr("ModelInspection.InspectModel"));
  EXPECT_THAT(workers_[0]->log(), ::testing::Not(::testing::HasSubstr("inspected an upload")));
  // With the secret, an archive over the worker's --max_model_bytes (2 GiB) is refused at its
  // size, before anything is written; and so is one that runs past the size it declared.
  const std::string secret = ReadBytes(tmp_.File("cluster-secret")).substr(0, 70);
  grpc::Status status = InspectDirectly(0, secret, (int64_t{2} << 30) + 1, model);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("--max_model_bytes"));
  status = InspectDirectly(1, secret, 100, model);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(InspectionScratch(), ::testing::IsEmpty());
  // The right secret and an honest archive: inspected.
  EXPECT_TRUE(InspectDirectly(1, secret, static_cast<int64_t>(model.size()), model).ok());
}

TEST_F(ClusterInspectionTest, WithNoWorkerUpAnUploadIsUnavailableNamingWhatToStartAndTheNextWorkerTakesIt) {
  // Both workers die without a word: their endpoints were heard from seconds ago.
  for (auto& worker : workers_) worker->Kill();
  const std::string bytes = ReadBytes(kFixtures + "/models/bn1d_2d.traced_train.pt");
  v1::Model model;
  const grpc::Status unavailable = Upload(*Api(0), bytes, &model);
  EXPECT_EQ(unavailable.error_code(), grpc::StatusCode::UNAVAILABLE) << unavailable.error_message();
  EXPECT_THAT(unavailable.error_message(),
              ::testing::HasSubstr("no worker process is reachable to inspect the upload: start a --role=worker "
                                   "with --internal_token_file"));
  // A worker comes up: the same upload, again, is accepted.
  workers_.push_back(Start("worker-3", "worker"));
  const grpc::Status accepted = Upload(*Api(1), bytes, &model);
  EXPECT_TRUE(accepted.ok()) << accepted.error_message();
  EXPECT_GT(model.layers_size(), 0);
}

// Workers stopped (SIGTERM: each says it is gone): a job submitted to an api replica says
// that no worker is up and what to start, until one is; then it runs.
TEST_F(ClusterInspectionTest, AJobQueuedWhileNoWorkerIsUpSaysToStartOneAndRunsOnTheNext) {
  v1::Model model;
  ASSERT_TRUE(Upload(*Api(0), ReadBytes(kFixtures + "/models/bn1d_2d.traced_train.pt"), &model).ok());
  for (auto& worker : workers_) EXPECT_EQ(worker->Terminate(30), 0) << worker->log();
  grpc::ClientContext context;
  v1::Job job;
  ASSERT_TRUE(Api(1)->SubmitJob(&context, NpyJob(model.id(), "data/bn1d_2d.npy", 8), &job).ok());
  const v1::Job waiting = GetJob(*Api(0), job.id());
  ASSERT_EQ(waiting.state(), v1::QUEUED);
  EXPECT_EQ(waiting.wait().cause(), v1::JobWait::NO_WORKER);
  EXPECT_THAT(waiting.wait().reason(),
              ::testing::HasSubstr("no worker has been heard from in the last 35 s: start a worker "
                                   "(recal-server --role worker)"));
  workers_.push_back(Start("worker-3", "worker"));
  const v1::Job done = WaitForState(*Api(0), job.id(), v1::SUCCEEDED, 120);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.error().message();
  EXPECT_FALSE(done.has_wait());
}

TEST(ClusterApiRoleTest, AnApiReplicaWithoutTheClusterSecretDoesNotStartSayingWhy) {
  TempDir tmp;
  ServerProcess api(tmp.File("api"), {"--role=api"});
  EXPECT_FALSE(api.ok());
  EXPECT_THAT(api.log(), ::testing::HasSubstr("--role=api starts no recal-worker"));
  EXPECT_THAT(api.log(), ::testing::HasSubstr("--internal_token_file"));
}

// The cluster with the secret that lets api replicas relay pushed batches to workers.
class ClusterStreamTest : public ClusterTest {
 protected:
  ClusterStreamTest() {
    lease_seconds_ = 8;  // outlasts the worker stopped for up to 4 s below
    other_token_ = NewToken();
    extra_auth_ = AuthLine(other_token_, "vision", "submit");
  }

  // Every batch of a tensor file at batch size 8, as a client would push them.
  static std::vector<v1::Tensor> Batches(const std::string& spec) {
    std::vector<v1::Tensor> batches;
    auto source = data::OpenBatchSource(spec, 8);
    EXPECT_TRUE(source.ok()) << source.status();
    if (!source.ok()) return batches;
    while (true) {
      auto batch = (*source)->Next();
      EXPECT_TRUE(batch.ok()) << batch.status();
      if (!batch.ok() || !*batch) break;
      batches.push_back(engine::testing::ToProto((**batch)[0]));
    }
    return batches;
  }

  v1::Job SubmitStream(int api, const std::string& model_id, int shards = 0, int max_batches = 0) {
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_model_id(model_id);
    request.mutable_spec()->set_batch_size(8);
    request.mutable_spec()->set_shards(shards);
    request.mutable_spec()->mutable_options()->set_max_batches(max_batches);
    request.mutable_spec()->mutable_data()->mutable_client_stream();
    grpc::ClientContext context;
    v1::Job job;
    const grpc::Status submitted = Api(api)->SubmitJob(&context, request, &job);
    EXPECT_TRUE(submitted.ok()) << submitted.error_message();
    return job;
  }

  double ErrorAgainstReference(const std::string& id) {
    const std::string path = tmp_.File(id + ".safetensors");
    std::ofstream(path, std::ios::binary) << Download(*Api(0), id, v1::BN_BUFFERS);
    return engine::testing::WorstRelativeError(
        engine::testing::ReadSafetensors(path),
        engine::testing::ReadSafetensors(kFixtures + "/ref/resnet18.population.safetensors"));
  }

  std::string other_token_;
};

TEST_F(ClusterStreamTest, PushesThroughEitherReplicaReachTheWorkerRunningTheJob) {
  v1::Model resnet;
  ASSERT_TRUE(Upload(*Api(0), ReadBytes(kFixtures + "/models/resnet18.traced_eval.pt"), &resnet).ok());
  const std::vector<v1::Tensor> batches = Batches("npy:" + kFixtures + "/data/resnet18.npy");
  ASSERT_EQ(batches.size(), 3u);

  // Submitted on replica A, pushed through replica B (at once: the push waits for a worker to
  // take the job up), run on a worker: the float64 reference, as under --role=all. Each batch
  // in parts, which the replica relays as they come and the worker joins.
  const v1::Job job = SubmitStream(0, resnet.id());
  const grpc::Status pushed = PushAll(*Api(1), job.id(), 0, batches, /*part_bytes=*/50000);
  ASSERT_TRUE(pushed.ok()) << pushed.error_message();
  const v1::Job done = WaitForState(*Api(0), job.id(), v1::SUCCEEDED, 60);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.error().message();
  EXPECT_EQ(done.progress().batches_done(), 3);
  EXPECT_GE(WorkerThatStarted(job.id(), 1), 0);
  EXPECT_LE(ErrorAgainstReference(job.id()), 1e-5);

  // A sharded one: each shard's pusher on its own replica, each relayed to its shard's worker.
  const v1::Job sharded = SubmitStream(1, resnet.id(), 2);
  grpc::Status shard_status[2];
  std::thread shard1([&] { shard_status[1] = PushAll(*Api(1), sharded.id(), 1, {batches[2]}); });
  shard_status[0] = PushAll(*Api(0), sharded.id(), 0, {batches[0], batches[1]});
  shard1.join();
  EXPECT_TRUE(shard_status[0].ok()) << shard_status[0].error_message();
  EXPECT_TRUE(shard_status[1].ok()) << shard_status[1].error_message();
  const v1::Job merged = WaitForState(*Api(1), sharded.id(), v1::SUCCEEDED, 60);
  ASSERT_EQ(merged.state(), v1::SUCCEEDED) << merged.error().message();
  EXPECT_LE(ErrorAgainstReference(sharded.id()), 1e-5);

  // Back-pressure across both hops: while the worker takes nothing (stopped with SIGSTOP,
  // for less than a lease), the pusher's writes stop after a bounded number of batches (the
  // feed's 4 and what the flow-control windows hold), and go on once it runs again.
  const int total = 160;
  const v1::Job held = SubmitStream(1, resnet.id(), 0, total);
  std::atomic<int> written{0};
  grpc::Status held_status;
  std::thread pusher([&] {
    grpc::ClientContext context;
    v1::PushBatchesResponse response;
    auto writer = Api(0)->PushBatches(&context, &response);
    for (int i = 0; i < total; ++i) {
      v1::PushBatchesRequest message;
      message.set_job_id(held.id());
      *message.add_inputs() = batches[0];
      if (!writer->Write(message)) break;
      ++written;
    }
    v1::PushBatchesRequest last;
    last.set_job_id(held.id());
    last.set_last(true);
    writer->Write(last);
    writer->WritesDone();
    held_status = writer->Finish();
  });
  int held_on = -1;
  for (int i = 0; i < 600 && (held_on < 0 || written < 8); ++i) {
    held_on = WorkerThatStarted(held.id(), 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(held_on, 0);
  const pid_t held_pid = WorkerPid(held_on);
  ASSERT_GT(held_pid, 0);
  ASSERT_EQ(::kill(held_pid, SIGSTOP), 0);
  // What is already in flight still lands for a moment (longer on a slow machine or under a
  // sanitizer): wait until a second passes without a write (3 s at most, so that with the
  // second below the stopped worker keeps its 8 s lease), then watch one more.
  int settled = written;
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const int now = written;
    if (now == settled) break;
    settled = now;
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int a_second_later = written;
  ASSERT_EQ(::kill(held_pid, SIGCONT), 0);
  pusher.join();
  std::cout << "a stopped worker held the pusher at " << a_second_later << " of " << total << " batches ("
            << a_second_later * batches[0].data().size() / 1e6 << " MB)\n";
  EXPECT_EQ(a_second_later, settled) << "the pusher went on while the worker took nothing";
  // Held well before the end: what two hops' flow-control windows and socket buffers hold
  // (which grow on a slow reader: 31 MB under ThreadSanitizer) and the feed's 4 batches.
  EXPECT_LT(a_second_later * batches[0].data().size(), 48e6);
  EXPECT_TRUE(held_status.ok()) << held_status.error_message();
  const v1::Job held_done = WaitForState(*Api(0), held.id(), v1::SUCCEEDED, 60);
  EXPECT_EQ(held_done.progress().batches_done(), total) << held_done.error().message();
  EXPECT_EQ(held_done.attempts(), 1);

  // Another tenant pushing to this tenant's job is refused at the api, as a job that does not
  // exist, before anything is relayed.
  const v1::Job waiting = SubmitStream(0, resnet.id());
  const grpc::Status foreign = PushAll(*apis_[1]->Stub(other_token_), waiting.id(), 0, {batches[0]});
  EXPECT_EQ(foreign.error_code(), grpc::StatusCode::NOT_FOUND) << foreign.error_message();

  // The internal endpoint serves only the cluster's own processes: no secret, or a wrong one,
  // is UNAUTHENTICATED, and nothing reaches the job's feed.
  const std::string internal = InternalAddress(0);
  ASSERT_FALSE(internal.empty()) << workers_[0]->log();
  auto relay = internal::v1::BatchRelay::NewStub(grpc::CreateChannel(internal, grpc::InsecureChannelCredentials()));
  for (const std::string& secret : {std::string(), NewToken(), token_}) {
    grpc::ClientContext context;
    if (!secret.empty()) context.AddMetadata("x-recal-cluster-secret", secret);
    v1::PushBatchesResponse response;
    auto writer = relay->PushBatches(&context, &response);
    v1::PushBatchesRequest message;
    message.set_job_id(waiting.id());
    *message.add_inputs() = batches[0];
    writer->Write(message);
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED) << "secret: '" << secret << "'";
  }
  EXPECT_THAT(workers_[0]->log(), ::testing::HasSubstr("internal call refused"));
  // The job is whole: its own pushes still make it.
  ASSERT_TRUE(PushAll(*Api(0), waiting.id(), 0, batches).ok());
  EXPECT_EQ(WaitForState(*Api(1), waiting.id(), v1::SUCCEEDED, 60).progress().batches_done(), 3);
}

TEST_F(ClusterStreamTest, AWorkerKilledMidStreamFailsTheJobAndTellsThePusher) {
  v1::Model resnet;
  ASSERT_TRUE(Upload(*Api(0), ReadBytes(kFixtures + "/models/resnet18.traced_eval.pt"), &resnet).ok());
  const std::vector<v1::Tensor> batches = Batches("npy:" + kFixtures + "/data/resnet18.npy");
  ASSERT_FALSE(batches.empty());
  const v1::Job job = SubmitStream(0, resnet.id());

  // A client pushing slowly through replica B; its worker dies after a few batches.
  grpc::ClientContext context;
  v1::PushBatchesResponse response;
  auto writer = Api(1)->PushBatches(&context, &response);
  int running_on = -1;
  bool write_failed = false;
  for (int i = 0; i < 600 && !write_failed; ++i) {
    v1::PushBatchesRequest message;
    message.set_job_id(job.id());
    *message.add_inputs() = batches[0];
    write_failed = !writer->Write(message);
    if (running_on < 0 && i >= 4) {
      running_on = WorkerThatStarted(job.id(), 1);
      if (running_on >= 0) workers_[running_on]->Kill();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(running_on, 0);
  EXPECT_TRUE(write_failed) << "the pusher learns that its stream is broken";
  writer->WritesDone();
  const grpc::Status broken = writer->Finish();
  EXPECT_EQ(broken.error_code(), grpc::StatusCode::ABORTED) << broken.error_message();
  EXPECT_THAT(broken.error_message(), ::testing::HasSubstr("push from the first batch"));

  // The lease runs out (8 s) and the job fails, saying why; it is not run again elsewhere.
  const auto killed_at = std::chrono::steady_clock::now();
  const v1::Job failed = WaitForState(*Api(0), job.id(), v1::FAILED, 30);
  EXPECT_EQ(failed.state(), v1::FAILED);
  EXPECT_LT(SecondsSince(killed_at), 15);
  EXPECT_EQ(failed.error().code(), static_cast<int>(grpc::StatusCode::ABORTED));
  EXPECT_THAT(failed.error().message(), ::testing::HasSubstr("not kept"));
  EXPECT_EQ(failed.attempts(), 1);
  EXPECT_EQ(WorkerThatStarted(job.id(), 2), -1);

  // The other worker takes the next stream job.
  const v1::Job next = SubmitStream(1, resnet.id());
  ASSERT_TRUE(PushAll(*Api(0), next.id(), 0, batches).ok());
  const v1::Job done = WaitForState(*Api(1), next.id(), v1::SUCCEEDED, 60);
  EXPECT_EQ(done.state(), v1::SUCCEEDED) << done.error().message();
  EXPECT_EQ(WorkerThatStarted(next.id(), 1), 1 - running_on);
  EXPECT_LE(ErrorAgainstReference(next.id()), 1e-5);
}

// The relay over TLS: workers serve their internal endpoint with a certificate of the test CA,
// api replicas verify it with --internal_tls_ca.
class ClusterStreamTlsTest : public ClusterStreamTest {
 protected:
  ClusterStreamTlsTest() {
    certs_ = tmp_.File("certs");
    made_certs_ = std::system(("bash " RECAL_SOURCE_DIR "/tests/certs/make_test_certs.sh " + certs_).c_str()) == 0;
    worker_flags_ = {"--tls_cert=" + certs_ + "/server.pem", "--tls_key=" + certs_ + "/server.key"};
    api_flags_ = {"--internal_tls_ca=" + certs_ + "/ca.pem"};
  }
  std::string certs_;
  bool made_certs_ = false;
};

TEST_F(ClusterStreamTlsTest, PushesAreRelayedOverTlsAndPlaintextIsRefused) {
  ASSERT_TRUE(made_certs_);
  v1::Model resnet;
  ASSERT_TRUE(Upload(*Api(0), ReadBytes(kFixtures + "/models/resnet18.traced_eval.pt"), &resnet).ok());
  const std::vector<v1::Tensor> batches = Batches("npy:" + kFixtures + "/data/resnet18.npy");
  const v1::Job job = SubmitStream(1, resnet.id());
  const grpc::Status pushed = PushAll(*Api(0), job.id(), 0, batches);
  ASSERT_TRUE(pushed.ok()) << pushed.error_message();
  const v1::Job done = WaitForState(*Api(1), job.id(), v1::SUCCEEDED, 60);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.error().message();
  EXPECT_LE(ErrorAgainstReference(job.id()), 1e-5);

  // Plaintext, even with the right secret, gets no further than the handshake.
  const std::string internal = InternalAddress(0);
  ASSERT_FALSE(internal.empty());
  auto relay = internal::v1::BatchRelay::NewStub(grpc::CreateChannel(internal, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  context.AddMetadata("x-recal-cluster-secret", ReadBytes(tmp_.File("cluster-secret")).substr(0, 70));
  v1::PushBatchesResponse response;
  auto writer = relay->PushBatches(&context, &response);
  writer->WritesDone();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace recal::testing
