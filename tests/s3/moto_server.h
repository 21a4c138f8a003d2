// moto_server (Python's moto, a real S3-compatible server) for tests and benches: started
// on 127.0.0.1 by the test, in its own process group, its log (one line per request, by
// werkzeug) in a file; optionally with IAM authentication on, so that every request's
// SigV4 signature is checked by an independent implementation (botocore's). Where
// moto_server is not on PATH, callers skip, saying so.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/s3/s3_client.h"
#include "server/s3/sigv4.h"

namespace recal::s3::testing {

// The executable `name` in a directory of $PATH, or "".
std::string FindOnPath(const std::string& name);

// A plain HTTP POST for a test's own setup (moto's IAM and control API). `service`
// non-empty: signed for that service with placeholder keys (moto routes on the credential
// scope; authentication is still off while the setup runs).
absl::StatusOr<std::string> HttpPost(const std::string& endpoint, const std::string& path, const std::string& body,
                                     const std::string& service);

class MotoServer {
 public:
  // Forks moto_server on a free port, its output to `log`; Ready() waits for it to answer.
  static std::unique_ptr<MotoServer> Launch(const std::string& binary, const std::string& log);
  bool Ready();
  // Launch + Ready; nullptr if it does not come up within 30 s.
  static std::unique_ptr<MotoServer> Start(const std::string& binary, const std::string& log);
  ~MotoServer() { Stop(); }
  // SIGTERM to the group, then waits: the endpoint refuses connections afterwards.
  void Stop();
  std::string endpoint() const;  // "http://127.0.0.1:PORT"
  const std::string& log() const { return log_; }

 private:
  MotoServer() = default;
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_;
};

// Creates an IAM user with s3:* and an access key on the moto at `endpoint`, then switches
// its authentication on. Returns the key.
absl::StatusOr<Credentials> EnableAuth(const std::string& endpoint);

// Options for a client of a test's server: path-style, three attempts with short backoffs
// (10 s at most), a 2 s connect timeout and a 10 s stall limit, so that a test of a stopped or
// hung endpoint ends within seconds.
S3ClientOptions FastClientOptions(const std::string& endpoint, Credentials credentials);

// Lines of moto's log for requests with this method whose target starts with `target`
// ("/bucket/key"), e.g. the GETs of one object.
int CountRequests(const std::string& log, const std::string& method, const std::string& target);

}  // namespace recal::s3::testing
