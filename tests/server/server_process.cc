#include "tests/server/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <random>
#include <thread>

#include <grpcpp/support/client_interceptor.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace recal::testing {
namespace {

class BearerInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(std::string value) : value_(std::move(value)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", value_});
    }
    methods->Proceed();
  }

 private:
  const std::string value_;
};

class BearerInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(std::string token) : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor("Bearer " + token_);
  }

 private:
  const std::string token_;
};

}  // namespace

std::string NewToken() {
  std::random_device random;
  std::string token = "recal_";
  for (int i = 0; i < 8; ++i) absl::StrAppend(&token, absl::Hex(random(), absl::kZeroPad8));
  return token;
}

std::string AuthLine(const std::string& token, const std::string& tenant, const std::string& role) {
  return absl::StrCat("token-sha256:", Sha256Hex(token), " tenant=", tenant, " role=", role, "\n");
}

std::shared_ptr<grpc::Channel> ChannelWithToken(const std::string& target, const std::string& token,
                                                std::shared_ptr<grpc::ChannelCredentials> credentials,
                                                grpc::ChannelArguments args) {
  if (!credentials) credentials = grpc::InsecureChannelCredentials();
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!token.empty()) interceptors.push_back(std::make_unique<BearerInterceptorFactory>(token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args, std::move(interceptors));
}

ServerProcess::ServerProcess(std::string data_dir, std::vector<std::string> flags, Auth auth)
    : data_dir_(std::move(data_dir)) {
  static int serial = 0;
  const std::string name = data_dir_ + ".server" + std::to_string(getpid()) + "-" + std::to_string(serial++);
  log_path_ = name + ".log";
  const bool own_auth_file = std::any_of(flags.begin(), flags.end(), [](const std::string& flag) {
    return flag.rfind("--auth_file", 0) == 0;
  });
  if (auth == Auth::kAdminToken && !own_auth_file) {
    // One token per data dir, so that a restarted server admits the clients of the last one.
    const std::string token_file = data_dir_ + ".token", auth_file = data_dir_ + ".auth";
    std::ifstream(token_file) >> token_;
    if (token_.empty()) {
      token_ = NewToken();
      std::ofstream(token_file) << token_;
      std::ofstream(auth_file) << AuthLine(token_, "default", "admin");
    }
    flags.insert(flags.begin(), "--auth_file=" + auth_file);
  }
  // Metrics on any free port (never the fixed default, which parallel tests would share);
  // a later --metrics_listen in `flags` wins.
  std::vector<std::string> args = {RECAL_SERVER_BIN, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
                                   "--data_dir=" + data_dir_};
  args.insert(args.end(), flags.begin(), flags.end());
  pid_ = fork();
  if (pid_ == 0) {
    const int log = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(log, STDERR_FILENO);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  const std::regex listening("listening on port ([0-9]+)");
  for (int i = 0; i < 600 && port_ == 0; ++i) {  // up to 60 s: LibTorch loads slowly
    std::smatch match;
    const std::string text = log();
    if (std::regex_search(text, match, listening)) port_ = std::stoi(match[1]);
    int status = 0;
    if (port_ == 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

ServerProcess::~ServerProcess() {
  Kill();
  // A failed test shows what its servers said: their errors, and a sanitizer's report, which
  // ends the server (halt_on_error) and so is often why the test failed.
  if (::testing::Test::HasFailure()) {
    constexpr size_t kMaxShown = 64 << 10;
    const std::string text = log();
    std::cerr << "--- " << log_path_ << (text.size() > kMaxShown ? " (its end)" : "") << ":\n"
              << text.substr(text.size() > kMaxShown ? text.size() - kMaxShown : 0) << "--- end of the server's log\n";
  }
}

std::string ServerProcess::target() const { return "127.0.0.1:" + std::to_string(port_); }

std::shared_ptr<grpc::Channel> ServerProcess::Channel(const std::string& token) const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return ChannelWithToken(target(), token, nullptr, args);
}

std::unique_ptr<v1::Recal::Stub> ServerProcess::Stub(const std::string& token) const {
  return v1::Recal::NewStub(Channel(token));
}

void ServerProcess::Hangup() const {
  if (pid_ > 0) kill(pid_, SIGHUP);
}

grpc::health::v1::HealthCheckResponse::ServingStatus ServerProcess::Health() const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse response;
  grpc::health::v1::Health::NewStub(Channel(""))
      ->Check(&context, grpc::health::v1::HealthCheckRequest(), &response)
      .IgnoreError();
  return response.status();
}

void ServerProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int ServerProcess::Terminate(double seconds) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

int ServerProcess::metrics_port() const {
  const std::regex metrics("metrics on port ([0-9]+)");
  std::smatch match;
  const std::string text = log();
  return std::regex_search(text, match, metrics) ? std::stoi(match[1]) : 0;
}

std::string ServerProcess::log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

v1::Job PollJob(v1::Recal::Stub& stub, const std::string& id,
                const std::function<bool(const v1::Job&)>& done, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  v1::Job job;
  while (std::chrono::steady_clock::now() < deadline) {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_id(id);
    if (stub.GetJob(&context, request, &job).ok()) {
      if (done(job)) return job;
      const v1::JobState s = job.state();
      if (s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "job " << id << " did not get there: it is " << v1::JobState_Name(job.state()) << " "
                << job.error().message();
  return job;
}

// A plain HTTP/1.0 GET of /metrics on loopback; the body, or "" on any failure.
std::string ScrapeMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[65536];
      ssize_t got;
      while ((got = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, got);
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return response.rfind("HTTP/1.", 0) == 0 && response.find(" 200 ") != std::string::npos && body != std::string::npos
             ? response.substr(body + 4)
             : "";
}

}  // namespace recal::testing
