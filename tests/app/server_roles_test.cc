// The role matrix {all, api, worker} x {SQLite, PostgreSQL}, each server built from options in
// this process on port 0: it serves health SERVING, the API where its role has one (a worker
// answers health only), runs a job end to end (all), and stops within its shutdown timeout.
// An api replica and a worker on one PostgreSQL store run a job between them. A server whose
// workers cannot run LibTorch under their memory limit does not start.
#include <chrono>
#include <filesystem>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/data_spec.h"
#include "common/sanitizers.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/app/server.h"
#include "server/app/server_options.h"
#include "tests/server/calls.h"
#include "tests/server/server_process.h"
#include "tests/store/postgres_server.h"
#include "tests/test_util.h"

namespace recal::app {

void PrintTo(Role role, std::ostream* os) { *os << RoleName(role); }

namespace {

using grpc::health::v1::HealthCheckResponse;

const std::string kFixtures = RECAL_FIXTURES_DIR;
constexpr absl::Duration kShutdownTimeout = absl::Seconds(5);

enum class Backend { kSqlite, kPostgres };

void PrintTo(Backend backend, std::ostream* os) { *os << (backend == Backend::kSqlite ? "sqlite" : "postgresql"); }

// The store's spec for a test: an SQLite file under `tmp`, or a fresh PostgreSQL database
// (empty, with the reason in `skip`, where PostgreSQL is not installed).
std::string StoreFor(Backend backend, const testing::TempDir& tmp, std::string* skip) {
  if (backend == Backend::kSqlite) return "sqlite:" + tmp.File("recal.db");
  auto postgres = testing::PostgresServer::Shared();
  if (absl::IsNotFound(postgres.status())) {
    *skip = std::string(postgres.status().message());
    return "";
  }
  EXPECT_TRUE(postgres.ok()) << postgres.status();
  if (!postgres.ok()) return "";
  auto uri = (*postgres)->NewDatabase();
  EXPECT_TRUE(uri.ok()) << uri.status();
  return uri.ok() ? *uri : "";
}

// Options of a server in `tmp` on loopback, any free ports, open (no auth file), reading the
// fixtures; roles api and worker share the cluster secret in `tmp`.
ServerOptions OptionsFor(Role role, const std::string& store, const testing::TempDir& tmp, const std::string& name) {
  ServerOptions options;
  options.role = role;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "127.0.0.1:0";
  options.internal_listen = "127.0.0.1:0";
  options.data_dir = tmp.File(name);
  options.store = store;
  options.blobs = "file:" + tmp.File("blobs");
  options.worker_binary = RECAL_WORKER_BIN;
  options.data_roots.Add(kFixtures);
  options.shutdown_timeout = kShutdownTimeout;
  if (role != Role::kAll) {
    // One secret for every process of the cluster in `tmp`.
    if (!std::filesystem::exists(tmp.File("internal-token"))) {
      testing::WriteBytes(tmp.File("internal-token"), testing::NewToken() + "\n");
    }
    options.internal_token_file = tmp.File("internal-token");
  }
  return options;
}

std::shared_ptr<grpc::Channel> ChannelTo(const Server& server) {
  return testing::ChannelWithToken("127.0.0.1:" + std::to_string(server.port()), "");
}

HealthCheckResponse::ServingStatus HealthOf(const Server& server, grpc::Status* status = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  HealthCheckResponse response;
  const grpc::Status called =
      grpc::health::v1::Health::NewStub(ChannelTo(server))->Check(&context, {}, &response);
  if (status) *status = called;
  return response.status();
}

grpc::Status ListModels(const Server& server) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListModelsResponse response;
  return v1::Recal::NewStub(ChannelTo(server))->ListModels(&context, {}, &response);
}

// Uploads the smallest fixture model through `api` and runs an npy job on it (in `shards`) to
// SUCCEEDED.
void RunsAJob(const Server& api, int shards = 0) {
  auto stub = v1::Recal::NewStub(ChannelTo(api));
  v1::Model model;
  const grpc::Status uploaded =
      testing::Upload(*stub, testing::ReadBytes(kFixtures + "/models/bn1d_2d.traced_train.pt"), &model);
  ASSERT_TRUE(uploaded.ok()) << uploaded.error_message();
  grpc::ClientContext context;
  v1::Job job;
  v1::SubmitJobRequest request = testing::NpyJob(model.id(), "data/bn1d_2d.npy", 8);
  request.mutable_spec()->set_shards(shards);
  const grpc::Status submitted = stub->SubmitJob(&context, request, &job);
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();
  EXPECT_EQ(testing::WaitForState(*stub, job.id(), v1::SUCCEEDED).state(), v1::SUCCEEDED);
}

class ServerRolesTest : public ::testing::TestWithParam<std::tuple<Role, Backend>> {};

TEST_P(ServerRolesTest, ServesHealthAndItsRolesApiThenStopsWithinItsShutdownTimeout) {
  const auto [role, backend] = GetParam();
  testing::TempDir tmp;
  std::string skip;
  const std::string store = StoreFor(backend, tmp, &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(store.empty());
  auto server = Server::BuildAndStart(OptionsFor(role, store, tmp, "data"));
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
  EXPECT_GT((*server)->metrics_port(), 0);
  EXPECT_EQ(HealthOf(**server), HealthCheckResponse::SERVING);

  const grpc::Status listed = ListModels(**server);
  if (role == Role::kWorker) {
    EXPECT_EQ(listed.error_code(), grpc::StatusCode::UNIMPLEMENTED);  // clients talk to the api processes
    EXPECT_FALSE((*server)->internal_address().empty());
  } else {
    EXPECT_TRUE(listed.ok()) << listed.error_message();
  }
  if (role == Role::kAll) RunsAJob(**server);

  const absl::Time start = absl::Now();
  (*server)->Shutdown();
  EXPECT_LT(absl::Now() - start, kShutdownTimeout);
  grpc::Status after;
  HealthOf(**server, &after);
  EXPECT_FALSE(after.ok());  // nothing listens any more
}

INSTANTIATE_TEST_SUITE_P(RoleByStore, ServerRolesTest,
                         ::testing::Combine(::testing::Values(Role::kAll, Role::kApi, Role::kWorker),
                                            ::testing::Values(Backend::kSqlite, Backend::kPostgres)),
                         [](const auto& info) {
                           return std::string(RoleName(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) == Backend::kSqlite ? "_sqlite" : "_postgresql");
                         });

// Cluster mode in one process: the api replica's upload is inspected by the worker (over its
// internal endpoint, found through the heartbeat) and the worker runs the job.
TEST(ServerClusterTest, ApiAndWorkerOnOnePostgresStoreRunAJobBetweenThem) {
  testing::TempDir tmp;
  std::string skip;
  const std::string store = StoreFor(Backend::kPostgres, tmp, &skip);
  if (!skip.empty()) GTEST_SKIP() << skip;
  ASSERT_FALSE(store.empty());
  auto worker = Server::BuildAndStart(OptionsFor(Role::kWorker, store, tmp, "worker"));
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto api = Server::BuildAndStart(OptionsFor(Role::kApi, store, tmp, "api"));
  ASSERT_TRUE(api.ok()) << api.status();
  RunsAJob(**api);
}

// The job's data travels typed from the RPC to the worker (server/jobs/job_plan.h): admission
// checks it once and nothing in the server parses a data spec from text, for a job, its shards
// or their merge. (The worker's side: tests/worker/worker_task_test.cc.)
TEST(ServerDataTest, AJobsDataIsNeverParsedFromTextBetweenTheRpcAndTheWorker) {
  testing::TempDir tmp;
  auto server = Server::BuildAndStart(OptionsFor(Role::kAll, "sqlite:" + tmp.File("recal.db"), tmp, "data"));
  ASSERT_TRUE(server.ok()) << server.status();
  const int64_t parsed_before = data::ParseDataSpecCount();
  RunsAJob(**server);
  RunsAJob(**server, /*shards=*/2);
  EXPECT_EQ(data::ParseDataSpecCount() - parsed_before, 0);
}

// Every upload would crash in its worker under an inspection limit that does not hold
// LibTorch: the server refuses to start instead, naming the flag.
TEST(ServerStartTest, AnInspectionLimitNoWorkerCanWorkUnderIsRefusedAtStartNamingItsFlag) {
  if (kSanitizer != nullptr) GTEST_SKIP() << "a sanitizer build sets no RLIMIT_AS";
  testing::TempDir tmp;
  ServerOptions options = OptionsFor(Role::kAll, "sqlite:" + tmp.File("recal.db"), tmp, "data");
  options.inspection_memory_bytes = int64_t{1} << 30;
  auto server = Server::BuildAndStart(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition) << server.status();
  EXPECT_THAT(server.status().message(), ::testing::HasSubstr("1073741824 bytes (--inspection_memory_bytes)"));
}

}  // namespace
}  // namespace recal::app
