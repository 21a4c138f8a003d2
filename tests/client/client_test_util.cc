#include "tests/client/client_test_util.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

namespace recal::testing {

void ServerTest::SetUp() {
  data_dir_ = tmp_.File("data");
  std::filesystem::create_directories(own_root());
  server_ = std::make_unique<ServerProcess>(data_dir_, Flags());
  ASSERT_TRUE(server_->ok()) << server_->log();
}

std::vector<std::string> ServerTest::Flags() {
  return {"--data_root=" + kFixtures + "," + own_root(), "--threads_per_worker=1"};
}

void ServerTest::RestartOnSamePort() {
  const int port = server_->port();
  server_->Kill();
  std::vector<std::string> flags = Flags();
  // ServerProcess asks for port 0 first; the later --listen wins.
  flags.push_back("--listen=127.0.0.1:" + std::to_string(port));
  server_ = std::make_unique<ServerProcess>(data_dir_, flags);
  ASSERT_TRUE(server_->ok()) << server_->log();
  ASSERT_EQ(server_->port(), port);
}

int ClosedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ADD_FAILURE() << "cannot bind a loopback port";
  }
  ::close(fd);  // never listened: connecting is refused
  return ntohs(addr.sin_port);
}

Result Recalctl(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  return RunBinary(RECALCTL_BIN, args, env);
}

}  // namespace recal::testing
