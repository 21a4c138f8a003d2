// A scripted HTTP/1.1 server on 127.0.0.1 for the S3 client's fault tests: it answers each
// request with the next reply of its script (503 SlowDown twice, then 200; a redirect; a
// connection cut short; no answer at all) and records what it was sent.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace recal::s3::testing {

struct ReceivedRequest {
  std::string method;
  std::string target;                          // "/bucket/key?x=y"
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;
};

struct ScriptedReply {
  std::string raw;      // the bytes sent back, as they are (see HttpReply)
  bool hang = false;    // read the request, then never answer (until the server stops)
};

// A complete response: status line, the headers, Content-Length (unless the headers give
// one: a response may announce more than it sends) and Connection: close.
std::string HttpReply(int status, const std::vector<std::pair<std::string, std::string>>& headers,
                      const std::string& body);

class ScriptedHttpServer {
 public:
  ScriptedHttpServer();  // listening on 127.0.0.1, a free port
  ~ScriptedHttpServer();

  int port() const { return port_; }
  std::string endpoint() const;  // "http://127.0.0.1:PORT"
  // Replies in order; once the script runs out, every request gets 500.
  void Script(std::vector<ScriptedReply> replies);
  std::vector<ReceivedRequest> requests();

 private:
  void Serve();
  void Handle(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::deque<ScriptedReply> script_;
  std::vector<ReceivedRequest> requests_;
  std::thread thread_;
};

// A port on 127.0.0.1 that nothing listens on (bound, then closed).
int UnusedPort();

}  // namespace recal::s3::testing
