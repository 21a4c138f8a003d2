// One HTTP/1.1 exchange over libcurl, the layer under the S3 client (s3_client.h), which adds
// what is S3's: addressing, SigV4 signing, error bodies and which failures to retry.
//
// Thread-safe: one transport serves every thread. Each exchange borrows a libcurl easy
// handle from a pool, so consecutive exchanges reuse the connection (keep-alive) without
// sharing a handle between threads.
//
// Never follows redirects: the endpoint is configuration, and a 3xx (a wrong region, or a
// hostile endpoint) could otherwise send signed requests or data to another host. Speaks
// http and https only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace recal::s3 {

// A request body read by position, so that a retried request can send it again from the
// start without the whole body in memory.
struct Body {
  int64_t size = 0;
  // Fills buf with up to len bytes at offset; returns the count (0 only at the end).
  std::function<absl::StatusOr<size_t>(int64_t offset, char* buf, size_t len)> read;
  // Hex SHA-256 of the body, signed so that S3 refuses a corrupted upload; empty: sent as
  // UNSIGNED-PAYLOAD (a stream whose hash is unknown before it is sent).
  std::string sha256_hex;
};

// The bytes must outlive the call.
Body BodyFromBytes(absl::string_view bytes);
// [offset, offset + size) of the file, hashed first (one extra read, usually from the page
// cache) so that the payload is signed. The file stays open until the Body is destroyed.
absl::StatusOr<Body> BodyFromFile(const std::string& path, int64_t offset, int64_t size);

// Receives a response body in pieces, in order. A non-OK status aborts the transfer and is
// returned as it is.
using ByteSink = std::function<absl::Status(absl::string_view)>;

struct HttpTimeouts {
  absl::Duration connect = absl::Seconds(5);
  // A transfer slower than low_speed_bytes per second for low_speed_time is abandoned: a
  // hung server cannot hold a caller forever, however large the body.
  int64_t low_speed_bytes = 1024;
  absl::Duration low_speed_time = absl::Seconds(30);
  // Whole-exchange limit; zero: none (a 10 GB upload is legitimately slow).
  absl::Duration total = absl::ZeroDuration();
};

struct HttpRequest {
  std::string what;  // names the exchange in messages: "GetObject s3://bucket/key"
  std::string peer;  // names the server in transport failures: "S3 endpoint https://host"
  std::string method = "GET";
  std::string url;
  std::vector<std::string> header_lines;  // "Name: value", sent as they are
  const Body* body = nullptr;             // PUT and POST; must outlive the exchange
  bool head = false;                      // no response body
  // Called once, before the first byte of a 2xx body, with the status and the headers
  // (lowercase names); an error aborts the transfer and is returned as it is.
  std::function<absl::Status(int http, const std::map<std::string, std::string>& headers)> on_headers;
  // Receives a 2xx body instead of HttpResponse::body; an error aborts.
  ByteSink sink;
  size_t max_body = 1 << 20;  // a larger buffered 2xx body is RESOURCE_EXHAUSTED
};

struct HttpResponse {
  int http = 0;
  std::map<std::string, std::string> headers;  // lowercase names
  // A buffered 2xx body, or the beginning (at most 64 KiB) of any other status's body.
  std::string body;
};

class HttpTransport {
 public:
  explicit HttpTransport(HttpTimeouts timeouts);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Any HTTP status is a response. A failure of the exchange itself is UNAVAILABLE naming
  // the request's `what` and `peer`, with *retryable saying whether another attempt may get
  // through (refused or broken connections, timeouts); a callback's error is returned as it
  // is, never retryable.
  absl::StatusOr<HttpResponse> Perform(const HttpRequest& request, bool* retryable);

 private:
  void* AcquireHandle();
  void ReleaseHandle(void* handle);

  const HttpTimeouts timeouts_;
  std::mutex pool_mu_;
  std::vector<void*> pool_;  // CURL* (kept out of this header)
};

}  // namespace recal::s3
