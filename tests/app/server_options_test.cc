// Options recal-server refuses, each with the message its flag gave: the role, the cluster
// secret, an open server beyond loopback, the devices, the workers' memory cgroups. Nothing
// listens when they are refused.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/app/server.h"
#include "absl/strings/str_cat.h"
#include "server/app/server_options.h"
#include "server/jobs/worker_runner.h"
#include "tests/test_util.h"

namespace recal::app {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

ServerOptions OptionsIn(const testing::TempDir& tmp, Role role) {
  ServerOptions options;
  options.role = role;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.internal_listen = "127.0.0.1:0";
  options.data_dir = tmp.File("data");
  options.worker_binary = RECAL_WORKER_BIN;
  return options;
}

TEST(ServerOptions, RoleIsParsedFromItsNameOrRefusedSayingTheNames) {
  EXPECT_EQ(*ParseRole("all"), Role::kAll);
  EXPECT_EQ(*ParseRole("api"), Role::kApi);
  EXPECT_EQ(*ParseRole("worker"), Role::kWorker);
  for (Role role : {Role::kAll, Role::kApi, Role::kWorker}) EXPECT_EQ(*ParseRole(RoleName(role)), role);
  const absl::StatusOr<Role> bad = ParseRole("both");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "--role=both is not all, api or worker");
}

TEST(ServerOptions, ApiWithoutInternalTokenFileIsRefused) {
  testing::TempDir tmp;
  const auto server = Server::BuildAndStart(OptionsIn(tmp, Role::kApi));
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(server.status().message()), StartsWith("--role=api starts no recal-worker"));
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("give --internal_token_file=FILE"));
}

TEST(ServerOptions, InternalTokenShorterThan32CharactersIsRefused) {
  testing::TempDir tmp;
  testing::WriteBytes(tmp.File("token"), "too short\n");
  for (Role role : {Role::kApi, Role::kWorker}) {
    ServerOptions options = OptionsIn(tmp, role);
    options.internal_token_file = tmp.File("token");
    const auto server = Server::BuildAndStart(options);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << RoleName(role);
  }
}

TEST(ServerOptions, OpenServerBeyondLoopbackIsRefusedUnlessAllowed) {
  testing::TempDir tmp;
  ServerOptions options = OptionsIn(tmp, Role::kAll);
  options.listen = "0.0.0.0:0";
  const auto refused = Server::BuildAndStart(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), StartsWith("refusing to serve 0.0.0.0:0 without credentials"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--allow_unauthenticated"));

  options.allow_unauthenticated = true;
  const auto allowed = Server::BuildAndStart(options);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_GT((*allowed)->port(), 0);
}

TEST(ServerOptions, DevicesThatNameNoDeviceAreRefused) {
  testing::TempDir tmp;
  ServerOptions options = OptionsIn(tmp, Role::kWorker);
  options.devices = "tpu:0";
  const auto server = Server::BuildAndStart(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ServerOptions, MissingWorkerBinaryIsRefusedWhereJobsRun) {
  testing::TempDir tmp;
  for (Role role : {Role::kAll, Role::kWorker}) {
    ServerOptions options = OptionsIn(tmp, role);
    options.worker_binary = tmp.File("no-such-recal-worker");
    const auto server = Server::BuildAndStart(options);
    EXPECT_FALSE(server.ok()) << RoleName(role);
    EXPECT_THAT(std::string(server.status().message()), StartsWith("the worker does not start: ")) << RoleName(role);
  }
}

// --worker_memory_cgroup: auto, required or off. required starts only where the kernel lets
// this process make the workers' memory cgroups, and is refused with the reason elsewhere.
TEST(ServerOptions, AWorkerMemoryCgroupIsAutoRequiredOrOffAndRequiredIsMetOrRefusedWithWhy) {
  testing::TempDir tmp;
  ServerOptions options = OptionsIn(tmp, Role::kAll);
  options.worker_memory_cgroup = "sometimes";
  const auto bad = Server::BuildAndStart(options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_EQ(bad.status().message(), "--worker_memory_cgroup=sometimes: use auto, required or off");

  options.worker_memory_cgroup = "required";
  const auto required = Server::BuildAndStart(options);
  const absl::StatusOr<sandbox::CgroupParent>& parent = jobs::WorkerCgroupParent();
  if (parent.ok()) {
    EXPECT_TRUE(required.ok()) << required.status();
    return;
  }
  EXPECT_EQ(required.status().code(), absl::StatusCode::kFailedPrecondition) << required.status();
  EXPECT_EQ(required.status().message(),
            absl::StrCat("--worker_memory_cgroup=required, but no memory cgroup can be made for the workers: ",
                         parent.status().message()));
}

}  // namespace
}  // namespace recal::app
