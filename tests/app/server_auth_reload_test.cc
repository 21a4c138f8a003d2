// Server::ReloadAuth (what SIGHUP calls): a new auth file takes effect at once; one that does
// not parse leaves the credentials in force.
#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "server/app/server.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace recal::app {
namespace {

grpc::StatusCode ListModelsAs(const Server& server, const std::string& token) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListModelsResponse response;
  auto stub = v1::Recal::NewStub(testing::ChannelWithToken("127.0.0.1:" + std::to_string(server.port()), token));
  return stub->ListModels(&context, {}, &response).error_code();
}

TEST(ServerAuthReload, TakesTheNewFileAndKeepsTheOldOneWhenTheNewDoesNotParse) {
  testing::TempDir tmp;
  const std::string first = testing::NewToken(), second = testing::NewToken();
  testing::WriteBytes(tmp.File("auth"), testing::AuthLine(first, "default", "admin"));
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.data_dir = tmp.File("data");
  options.worker_binary = RECAL_WORKER_BIN;
  options.auth_file = tmp.File("auth");
  auto server = Server::BuildAndStart(options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ(ListModelsAs(**server, first), grpc::StatusCode::OK);
  EXPECT_EQ(ListModelsAs(**server, second), grpc::StatusCode::UNAUTHENTICATED);

  testing::WriteBytes(tmp.File("auth"), testing::AuthLine(second, "default", "admin"));
  (*server)->ReloadAuth();
  EXPECT_EQ(ListModelsAs(**server, second), grpc::StatusCode::OK);
  EXPECT_EQ(ListModelsAs(**server, first), grpc::StatusCode::UNAUTHENTICATED);

  testing::WriteBytes(tmp.File("auth"), "this is no auth file\n");
  (*server)->ReloadAuth();
  EXPECT_EQ(ListModelsAs(**server, second), grpc::StatusCode::OK);
}

}  // namespace
}  // namespace recal::app
