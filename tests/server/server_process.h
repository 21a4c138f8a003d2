// The real recal-server binary on a loopback port, for end-to-end tests.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "grpc/health/v1/health.pb.h"
#include "recal/v1/recal.grpc.pb.h"

namespace recal::testing {

// A token as `recalctl token new` makes one, and the auth-file line that admits it.
std::string NewToken();
std::string AuthLine(const std::string& token, const std::string& tenant, const std::string& role);

class ServerProcess {
 public:
  // kAdminToken: the server reads an auth file that admits one random token (token()) as
  // admin of the tenant "default", and Stub() / Channel() send it: the suite runs with
  // authentication on. kOpen: no auth file (the open mode on loopback). Flags that name
  // their own --auth_file replace the generated one.
  enum class Auth { kAdminToken, kOpen };

  // Starts `recal-server --listen=127.0.0.1:0 --data_dir=<data_dir> <flags>` and waits until it
  // says which port it listens on.
  ServerProcess(std::string data_dir, std::vector<std::string> flags, Auth auth = Auth::kAdminToken);
  ~ServerProcess();  // SIGKILL if still running

  bool ok() const { return port_ > 0; }
  int port() const { return port_; }
  std::string target() const;
  // The admin token of kAdminToken (empty for kOpen).
  const std::string& token() const { return token_; }
  std::unique_ptr<v1::Recal::Stub> Stub() const { return Stub(token_); }
  std::shared_ptr<grpc::Channel> Channel() const { return Channel(token_); }
  // Calls that send `token` as their bearer token (none: empty).
  std::unique_ptr<v1::Recal::Stub> Stub(const std::string& token) const;
  std::shared_ptr<grpc::Channel> Channel(const std::string& token) const;
  // SIGHUP (the server reads its auth file again).
  void Hangup() const;
  // What its standard health service says (UNKNOWN when it does not answer within 5 s).
  grpc::health::v1::HealthCheckResponse::ServingStatus Health() const;

  void Kill();  // SIGKILL, and wait
  // SIGTERM; returns the exit status (or -1 if it did not exit within `seconds`).
  int Terminate(double seconds);
  std::string log() const;  // what it wrote on stderr
  int metrics_port() const;  // from its log; 0 if it serves no metrics
  pid_t pid() const { return pid_; }

 private:
  std::string data_dir_;
  std::string log_path_;
  std::string token_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// A channel to `target` whose every call carries "authorization: Bearer <token>" (none for an
// empty token), over `credentials` (plaintext when null).
std::shared_ptr<grpc::Channel> ChannelWithToken(const std::string& target, const std::string& token,
                                                std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr,
                                                grpc::ChannelArguments args = {});

// Polls GetJob every 50 ms until `done(job)` holds, the job ends without it (it will not
// change any more), or `seconds` pass; returns the last job seen and records a test failure
// unless `done` held.
v1::Job PollJob(v1::Recal::Stub& stub, const std::string& id,
                const std::function<bool(const v1::Job&)>& done, double seconds);

// A plain HTTP/1.0 GET of /metrics on loopback port `port`: the body, or "" on any failure.
std::string ScrapeMetrics(int port);

}  // namespace recal::testing
