#include "tests/s3/test_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace recal::s3::testing {
namespace {

int ListenLoopback(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 16) != 0) {
    ADD_FAILURE() << "bind/listen: " << std::strerror(errno);
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

// Waits up to 100 ms for fd to be readable; false on timeout.
bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 100) > 0;
}

}  // namespace

std::string HttpReply(int status, const std::vector<std::pair<std::string, std::string>>& headers,
                      const std::string& body) {
  std::string out = absl::StrCat("HTTP/1.1 ", status, " Scripted\r\n");
  bool has_length = false;
  for (const auto& [k, v] : headers) {
    absl::StrAppend(&out, k, ": ", v, "\r\n");
    has_length = has_length || absl::AsciiStrToLower(k) == "content-length";
  }
  if (!has_length) absl::StrAppend(&out, "Content-Length: ", body.size(), "\r\n");
  absl::StrAppend(&out, "Connection: close\r\n\r\n", body);
  return out;
}

int UnusedPort() {
  int port = 0;
  const int fd = ListenLoopback(&port);
  ::close(fd);
  return port;
}

ScriptedHttpServer::ScriptedHttpServer() {
  listen_fd_ = ListenLoopback(&port_);
  thread_ = std::thread([this] { Serve(); });
}

ScriptedHttpServer::~ScriptedHttpServer() {
  stop_ = true;
  thread_.join();
  ::close(listen_fd_);
}

std::string ScriptedHttpServer::endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }

void ScriptedHttpServer::Script(std::vector<ScriptedReply> replies) {
  std::lock_guard<std::mutex> lock(mu_);
  script_.assign(replies.begin(), replies.end());
}

std::vector<ReceivedRequest> ScriptedHttpServer::requests() {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

void ScriptedHttpServer::Serve() {
  while (!stop_) {
    if (!Readable(listen_fd_)) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Handle(fd);
    ::close(fd);
  }
}

void ScriptedHttpServer::Handle(int fd) {
  // One request per connection (every reply says Connection: close).
  std::string data;
  char buf[65536];
  size_t head_end = std::string::npos;
  size_t content_length = 0;
  while (!stop_) {
    if (head_end != std::string::npos && data.size() >= head_end + 4 + content_length) break;
    if (!Readable(fd)) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) return;
    data.append(buf, static_cast<size_t>(n));
    if (head_end == std::string::npos && (head_end = data.find("\r\n\r\n")) != std::string::npos) {
      for (absl::string_view line : absl::StrSplit(absl::string_view(data).substr(0, head_end), "\r\n")) {
        if (absl::StartsWithIgnoreCase(line, "content-length:")) {
          (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(15)), &content_length);
        }
      }
    }
  }
  if (head_end == std::string::npos) return;
  ReceivedRequest req;
  bool first = true;
  for (absl::string_view line : absl::StrSplit(absl::string_view(data).substr(0, head_end), "\r\n")) {
    if (first) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts.size() >= 2) {
        req.method = parts[0];
        req.target = parts[1];
      }
      first = false;
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    req.headers[absl::AsciiStrToLower(line.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  req.body = data.substr(head_end + 4);
  ScriptedReply reply{HttpReply(500, {}, "<Error><Code>InternalError</Code><Message>script ran out</Message></Error>")};
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(std::move(req));
    if (!script_.empty()) {
      reply = script_.front();
      script_.pop_front();
    }
  }
  if (reply.hang) {
    while (!stop_) ::usleep(20000);
    return;
  }
  for (size_t off = 0; off < reply.raw.size();) {
    const ssize_t n = ::send(fd, reply.raw.data() + off, reply.raw.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
}

}  // namespace recal::s3::testing
