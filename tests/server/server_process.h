// The real recal-server binary on a loopback port, for end-to-end tests.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "recal/v1/recal.grpc.pb.h"

namespace recal::testing {

class ServerProcess {
 public:
  // Starts `recal-server --listen=127.0.0.1:0 --data_dir=<data_dir> <flags>` and waits until it
  // says which port it listens on.
  ServerProcess(std::string data_dir, std::vector<std::string> flags);
  ~ServerProcess();  // SIGKILL if still running

  bool ok() const { return port_ > 0; }
  int port() const { return port_; }
  std::string target() const;
  std::unique_ptr<v1::Recal::Stub> Stub() const;
  std::shared_ptr<grpc::Channel> Channel() const;

  void Kill();  // SIGKILL, and wait
  // SIGTERM; returns the exit status (or -1 if it did not exit within `seconds`).
  int Terminate(double seconds);
  std::string log() const;  // what it wrote on stderr
  int metrics_port() const;  // from its log; 0 if it serves no metrics

 private:
  std::string data_dir_;
  std::string log_path_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// Polls GetJob every 50 ms until `done(job)` holds, the job ends without it (it will not
// change any more), or `seconds` pass; returns the last job seen and records a test failure
// unless `done` held.
v1::Job PollJob(v1::Recal::Stub& stub, const std::string& id,
                const std::function<bool(const v1::Job&)>& done, double seconds);

}  // namespace recal::testing
