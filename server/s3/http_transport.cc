#include "server/s3/http_transport.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace recal::s3 {
namespace {

constexpr size_t kMaxErrorBody = 64 << 10;

bool IsRetryableCurl(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
      return true;
    default:
      return false;
  }
}

// Per-exchange state that libcurl's callbacks write into.
struct Transfer {
  const HttpRequest* request = nullptr;
  CURL* curl = nullptr;
  std::map<std::string, std::string> headers;
  std::string body;
  bool headers_checked = false;
  absl::Status abort_status;  // why a callback stopped the transfer
  int64_t body_pos = 0;       // of the upload
};

long ResponseCode(CURL* curl) {
  long code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  return code;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  absl::string_view line(data, size * n);
  if (absl::StartsWith(line, "HTTP/")) {
    t->headers.clear();  // a new response (after a 100 Continue)
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    t->headers[absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, colon)))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return size * n;
}

size_t OnWrite(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t len = size * n;
  const long http = ResponseCode(t->curl);
  const HttpRequest& r = *t->request;
  if (http >= 200 && http < 300) {
    if (!t->headers_checked) {
      t->headers_checked = true;
      if (r.on_headers) {
        t->abort_status = r.on_headers(static_cast<int>(http), t->headers);
        if (!t->abort_status.ok()) return 0;
      }
    }
    if (r.sink) {
      t->abort_status = r.sink(absl::string_view(data, len));
      return t->abort_status.ok() ? len : 0;
    }
    if (t->body.size() + len > r.max_body) {
      t->abort_status = absl::ResourceExhaustedError(absl::StrCat(r.what, ": a response over ", r.max_body, " bytes"));
      return 0;
    }
  } else if (t->body.size() + len > kMaxErrorBody) {
    return len;  // an error body that large is no server's error document: keep its beginning only
  }
  t->body.append(data, len);
  return len;
}

size_t OnRead(char* buf, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const Body& body = *t->request->body;
  const size_t want = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(size * n), body.size - t->body_pos));
  if (want == 0) return 0;
  auto got = body.read(t->body_pos, buf, want);
  if (!got.ok() || *got == 0) {
    t->abort_status = got.ok() ? absl::DataLossError(absl::StrCat("the body of ", t->request->what, " ended at byte ",
                                                                  t->body_pos, " of ", body.size))
                               : got.status();
    return CURL_READFUNC_ABORT;
  }
  t->body_pos += static_cast<int64_t>(*got);
  return *got;
}

size_t ReadNothing(char*, size_t, size_t, void*) { return 0; }

struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// The method, body and callbacks of `r` on a reset handle.
void SetRequestOptions(CURL* curl, const HttpRequest& r, Transfer* t) {
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, t);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnWrite);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, t);
  const curl_off_t body_size = r.body ? r.body->size : 0;
  if (r.head) {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (r.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, body_size);
  } else if (r.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, body_size);
  } else if (r.method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  if (r.body != nullptr) {
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, OnRead);
    curl_easy_setopt(curl, CURLOPT_READDATA, t);
  } else if (r.method == "PUT" || r.method == "POST") {
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, ReadNothing);
  }
}

}  // namespace

Body BodyFromBytes(absl::string_view bytes) {
  Body b;
  b.size = static_cast<int64_t>(bytes.size());
  b.sha256_hex = Sha256Hex(bytes);
  b.read = [bytes](int64_t offset, char* buf, size_t len) -> absl::StatusOr<size_t> {
    const size_t n = std::min(len, bytes.size() - static_cast<size_t>(offset));
    std::memcpy(buf, bytes.data() + offset, n);
    return n;
  };
  return b;
}

absl::StatusOr<Body> BodyFromFile(const std::string& path, int64_t offset, int64_t size) {
  const int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("open ", path));
  }
  auto fd = std::shared_ptr<int>(new int(raw), [](int* p) {
    ::close(*p);
    delete p;
  });
  struct stat st {};
  if (::fstat(*fd, &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("stat ", path));
  if (offset < 0 || size < 0 || offset + size > st.st_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": bytes [", offset, ", +", size, ") are not inside its ", st.st_size, " bytes"));
  }
  Body b;
  b.size = size;
  b.read = [fd, path, offset, size](int64_t pos, char* buf, size_t len) -> absl::StatusOr<size_t> {
    const size_t want = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(len), size - pos));
    while (true) {
      const ssize_t n = ::pread(*fd, buf, want, offset + pos);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno != EINTR) return absl::ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
  };
  // Hash first: a signed payload lets S3 refuse bytes damaged on the way.
  Sha256 hash;
  std::string buf(1 << 20, '\0');
  for (int64_t pos = 0; pos < size;) {
    auto n = b.read(pos, buf.data(), buf.size());
    if (!n.ok()) return n.status();
    if (*n == 0) return absl::DataLossError(absl::StrCat(path, " shrank while it was read"));
    hash.Update(absl::string_view(buf.data(), *n));
    pos += static_cast<int64_t>(*n);
  }
  b.sha256_hex = hash.HexDigest();
  return b;
}


HttpTransport::HttpTransport(HttpTimeouts timeouts) : timeouts_(timeouts) { GlobalInit(); }

HttpTransport::~HttpTransport() {
  for (void* h : pool_) curl_easy_cleanup(static_cast<CURL*>(h));
}

void* HttpTransport::AcquireHandle() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!pool_.empty()) {
      void* h = pool_.back();
      pool_.pop_back();
      // Forgets the previous request's options; keeps its open connections and DNS cache.
      curl_easy_reset(static_cast<CURL*>(h));
      return h;
    }
  }
  return curl_easy_init();
}

void HttpTransport::ReleaseHandle(void* handle) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  pool_.push_back(handle);
}

absl::StatusOr<HttpResponse> HttpTransport::Perform(const HttpRequest& r, bool* retryable) {
  *retryable = false;
  std::unique_ptr<curl_slist, SlistDeleter> header_list;
  for (const std::string& line : r.header_lines) {
    header_list.reset(curl_slist_append(header_list.release(), line.c_str()));
    if (header_list == nullptr) return absl::ResourceExhaustedError("curl_slist_append failed");
  }
  CURL* curl = static_cast<CURL*>(AcquireHandle());
  if (curl == nullptr) return absl::ResourceExhaustedError("curl_easy_init failed");
  struct Release {
    HttpTransport* self;
    CURL* curl;
    ~Release() { self->ReleaseHandle(curl); }
  } release{this, curl};

  Transfer t;
  t.request = &r;
  t.curl = curl;
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_URL, r.url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, header_list.get());
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM-based DNS timeouts
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "recal-s3/1");
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(timeouts_.connect)));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, static_cast<long>(timeouts_.low_speed_bytes));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                   static_cast<long>(std::max<int64_t>(1, absl::ToInt64Seconds(timeouts_.low_speed_time))));
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(timeouts_.total)));
  SetRequestOptions(curl, r, &t);

  const CURLcode rc = curl_easy_perform(curl);
  if (!t.abort_status.ok()) return t.abort_status;  // our callback's decision, not the network's
  if (rc != CURLE_OK) {
    *retryable = IsRetryableCurl(rc);
    return absl::UnavailableError(absl::StrCat(r.what, ": ", r.peer, ": ", curl_easy_strerror(rc),
                                               errbuf[0] ? absl::StrCat(" (", errbuf, ")") : ""));
  }
  HttpResponse response;
  response.http = static_cast<int>(ResponseCode(curl));
  response.headers = std::move(t.headers);
  response.body = std::move(t.body);
  return response;
}

}  // namespace recal::s3
