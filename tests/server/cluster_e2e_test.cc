// The cluster mode end to end: a throwaway PostgreSQL, two api replicas and two workers (each
// its own process and local data dir, blobs on one shared directory). Jobs submitted through
// either replica run on both workers, a watch through the other replica sees them through, and
// a worker killed with SIGKILL mid-job loses the job to the other worker once its lease runs
// out: it completes there as attempt 2.
#include <signal.h>

#include <fstream>
#include <iostream>
#include <regex>
#include <mutex>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/server/calls.h"
#include "tests/server/server_process.h"
#include "tests/store/postgres_server.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

const std::string kFixtures = RECAL_FIXTURES_DIR;

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
               "--auth_file=" + tmp_.File("auth.txt"), "--lease_seconds=3"};
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
    // Run to completion once: one summary, one SUCCEEDED, whatever was retried on the way.
    int summaries = 0, succeeded = 0;
    for (const v1::JobEvent& event : Watch(*Api(1), id)) {
      summaries += event.has_summary();
      succeeded += event.kind_case() == v1::JobEvent::kState && event.state() == v1::SUCCEEDED;
    }
    EXPECT_EQ(summaries, 1) << id;
    EXPECT_EQ(succeeded, 1) << id;
    retried += job.attempts() > 1;
  }
  std::cout << retried << " of " << ids.size() << " jobs ran again after the outage\n";
}

}  // namespace
}  // namespace recal::testing
