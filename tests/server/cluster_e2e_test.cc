// The cluster mode end to end: a throwaway PostgreSQL, two api replicas and two workers (each
// its own process and local data dir, blobs on one shared directory). Jobs submitted through
// either replica run on both workers, a watch through the other replica sees them through, and
// a worker killed with SIGKILL mid-job loses the job to the other worker once its lease runs
// out: it completes there as attempt 2. The database cut off, and PostgreSQL itself crashed
// (SIGKILL) and started again mid-run: every job succeeds once, and no process is restarted.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <regex>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "grpc/health/v1/health.grpc.pb.h"
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
    std::ofstream(tmp_.File("auth.txt")) << AuthLine(token_, "default", "admin");
    shared_ = {"--store=" + *uri, "--blobs=file:" + tmp_.File("shared-blobs"), "--data_root=" + kFixtures,
               "--auth_file=" + tmp_.File("auth.txt"), "--lease_seconds=" + std::to_string(lease_seconds_)};
    for (const char* name : {"api-a", "api-b"}) apis_.push_back(Start(name, "api"));
    for (const char* name : {"worker-1", "worker-2"}) workers_.push_back(Start(name, "worker"));
  }
  std::unique_ptr<ServerProcess> Start(const std::string& name, const std::string& role) {
    std::vector<std::string> flags = shared_;
    flags.push_back("--role=" + role);
    auto process = std::make_unique<ServerProcess>(tmp_.File(name), flags, ServerProcess::Auth::kOpen);
    EXPECT_TRUE(process->ok()) << name << ": " << process->log();
    return process;
  }
  std::unique_ptr<v1::Recal::Stub> Api(int i) { return apis_[i]->Stub(token_); }
  // Which worker's log says it started `job_id` (attempt `attempt`); -1 if none.
  int WorkerThatStarted(const std::string& job_id, int attempt) {
    const std::regex started("job started job_id=" + job_id + " device=\\S+ attempt=" + std::to_string(attempt));
    for (size_t i = 0; i < workers_.size(); ++i) {
      if (std::regex_search(workers_[i]->log(), started)) return static_cast<int>(i);
    }
    return -1;
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
  grpc::ClientContext context;
  v1::Job job;
  ASSERT_TRUE(Api(0)->SubmitJob(&context, long_job, &job).ok());
  WaitForState(*Api(1), job.id(), v1::RUNNING, 60);
  int running_on = -1;
  for (int i = 0; i < 100 && running_on < 0; ++i) {
    running_on = WorkerThatStarted(job.id(), 1);
    if (running_on < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(running_on, 0);
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

  // A worker serves no API; an api replica takes no client-stream job (no relay yet).
  grpc::ClientContext c2;
  v1::ListJobsResponse listed;
  EXPECT_EQ(workers_[1 - running_on]->Stub(token_)->ListJobs(&c2, v1::ListJobsRequest(), &listed).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  v1::SubmitJobRequest stream;
  stream.mutable_spec()->set_model_id(small.id());
  stream.mutable_spec()->set_batch_size(8);
  stream.mutable_spec()->mutable_data()->mutable_client_stream();
  grpc::ClientContext c3;
  const grpc::Status refused = Api(0)->SubmitJob(&c3, stream, &job);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("--role=all"));
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

}  // namespace
}  // namespace recal::testing
