// recal-server on a PostgreSQL metadata store (a throwaway server started by the test): a job
// end to end against the float64 reference, and everything still there after a restart on a
// fresh data dir (nothing of the metadata lives on the local disk).
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

TEST(PostgresStoreServerTest, RunsAJobAndKeepsItAcrossARestartOnAnotherDataDir) {
  auto postgres = PostgresServer::Shared();
  if (absl::IsNotFound(postgres.status())) GTEST_SKIP() << postgres.status().message();
  ASSERT_TRUE(postgres.ok()) << postgres.status();
  auto uri = (*postgres)->NewDatabase();
  ASSERT_TRUE(uri.ok()) << uri.status();
  TempDir tmp;
  const std::string blobs = tmp.File("shared-blobs");
  const std::vector<std::string> flags = {"--store=" + *uri, "--blobs=file:" + blobs, "--data_root=" + kFixtures};

  std::string job_id, token;
  {
    ServerProcess server(tmp.File("host-a"), flags);
    ASSERT_TRUE(server.ok()) << server.log();
    EXPECT_THAT(server.log(), ::testing::HasSubstr("store=postgresql"));
    EXPECT_THAT(server.log(), ::testing::Not(::testing::HasSubstr(*uri)));  // the URI is never logged
    auto stub = server.Stub();
    v1::Model model;
    ASSERT_TRUE(Upload(*stub, ReadBytes(kFixtures + "/models/bn1d_2d.traced_train.pt"), &model).ok());
    grpc::ClientContext context;
    v1::Job job;
    ASSERT_TRUE(stub->SubmitJob(&context, NpyJob(model.id(), "data/bn1d_2d.npy", 8), &job).ok());
    EXPECT_EQ(WaitForState(*stub, job.id(), v1::SUCCEEDED).state(), v1::SUCCEEDED);
    job_id = job.id();
    token = server.token();
  }
  // Another process, another local data dir, the same store and blobs: the job, its events and
  // its results are all there.
  ServerProcess again(tmp.File("host-b"), flags, ServerProcess::Auth::kOpen);
  ASSERT_TRUE(again.ok()) << again.log();
  auto stub = again.Stub();
  std::vector<v1::JobEvent> events = Watch(*stub, job_id);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().state(), v1::SUCCEEDED);
  grpc::Status downloaded;
  const std::string bn = Download(*stub, job_id, v1::BN_BUFFERS, &downloaded);
  EXPECT_TRUE(downloaded.ok()) << downloaded.error_message();
  EXPECT_GT(bn.size(), 0u);
}

TEST(PostgresStoreServerTest, HealthFollowsTheStore) {
  auto postgres = PostgresServer::Shared();
  if (absl::IsNotFound(postgres.status())) GTEST_SKIP() << postgres.status().message();
  ASSERT_TRUE(postgres.ok()) << postgres.status();
  auto uri = (*postgres)->NewDatabase();
  ASSERT_TRUE(uri.ok()) << uri.status();
  const std::string database = uri->substr(uri->rfind('/') + 1);
  const std::string maintenance = uri->substr(0, uri->rfind('/') + 1) + "postgres";
  TempDir tmp;
  ServerProcess worker(tmp.File("worker"), {"--store=" + *uri, "--role=worker"});
  ASSERT_TRUE(worker.ok()) << worker.log();
  EXPECT_EQ(worker.Health(), grpc::health::v1::HealthCheckResponse::SERVING);

  // The database goes away (no new connections, the open ones cut): NOT_SERVING.
  ASSERT_TRUE(PostgresServer::Execute(maintenance, "ALTER DATABASE \"" + database + "\" ALLOW_CONNECTIONS false; "
                                                   "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                                   "WHERE datname = '" + database + "'")
                  .ok());
  auto status = worker.Health();
  for (int i = 0; i < 100 && status != grpc::health::v1::HealthCheckResponse::NOT_SERVING; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    status = worker.Health();
  }
  EXPECT_EQ(status, grpc::health::v1::HealthCheckResponse::NOT_SERVING) << worker.log();

  // It comes back: SERVING again, without a restart.
  ASSERT_TRUE(PostgresServer::Execute(maintenance, "ALTER DATABASE \"" + database + "\" ALLOW_CONNECTIONS true").ok());
  for (int i = 0; i < 100 && status != grpc::health::v1::HealthCheckResponse::SERVING; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    status = worker.Health();
  }
  EXPECT_EQ(status, grpc::health::v1::HealthCheckResponse::SERVING) << worker.log();
}

}  // namespace
}  // namespace recal::testing
