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
  TempDir io;
  const std::string out_path = io.File("out"), err_path = io.File("err");
  std::vector<std::string> argv = {RECALCTL_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::unsetenv("RECAL_SERVER");
    ::unsetenv("RECAL_TOKEN");
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    std::vector<char*> raw;
    for (std::string& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    ::execv(raw[0], raw.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  Result result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = ReadBytes(out_path);
  result.err = ReadBytes(err_path);
  return result;
}

}  // namespace recal::testing
