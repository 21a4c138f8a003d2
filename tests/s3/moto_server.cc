#include "tests/s3/moto_server.h"

#include <curl/curl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "server/s3/s3_config.h"
#include "tests/s3/test_http_server.h"

namespace recal::s3::testing {
namespace {

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

std::string Between(const std::string& s, const std::string& open, const std::string& close) {
  const size_t a = s.find(open);
  if (a == std::string::npos) return "";
  const size_t b = s.find(close, a + open.size());
  return b == std::string::npos ? "" : s.substr(a + open.size(), b - a - open.size());
}

std::string FormEncode(absl::string_view s) { return UriEncode(s, false); }

}  // namespace

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

absl::StatusOr<std::string> HttpPost(const std::string& endpoint, const std::string& path, const std::string& body,
                                     const std::string& service) {
  CURL* curl = curl_easy_init();
  std::string out;
  curl_slist* headers = nullptr;
  if (!service.empty()) {
    auto e = ParseEndpoint(endpoint);
    SigningRequest r{"POST", path, {}, {{"Host", e->HostHeader()}, {"Content-Type", "application/x-www-form-urlencoded"}},
                     Sha256Hex(body), false};
    auto s = SignV4(r, {{"AKIAIOSFODNN7EXAMPLE", "setup", ""}, "us-east-1", service, absl::Now()});
    if (!s.ok()) return s.status();
    headers = curl_slist_append(headers, "Content-Type: application/x-www-form-urlencoded");
    for (const auto& [k, v] : s->headers_to_add) headers = curl_slist_append(headers, absl::StrCat(k, ": ", v).c_str());
  } else {
    // moto's control API reads the raw body, which a form content type would hide.
    headers = curl_slist_append(headers, "Content-Type: text/plain");
  }
  const std::string url = endpoint + path;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &out);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 20L);
  const CURLcode rc = curl_easy_perform(curl);
  long http = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
  curl_slist_free_all(headers);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK) return absl::UnavailableError(curl_easy_strerror(rc));
  if (http != 200) return absl::InternalError(absl::StrCat("HTTP ", http, ": ", out));
  return out;
}

std::unique_ptr<MotoServer> MotoServer::Launch(const std::string& binary, const std::string& log) {
  auto m = std::unique_ptr<MotoServer>(new MotoServer);
  m->port_ = UnusedPort();
  m->log_ = log;
  m->pid_ = ::fork();
  if (m->pid_ == 0) {
    ::setpgid(0, 0);
    FILE* f = std::freopen(log.c_str(), "w", stdout);
    (void)f;
    ::dup2(STDOUT_FILENO, STDERR_FILENO);
    const std::string port = std::to_string(m->port_);
    ::execl(binary.c_str(), binary.c_str(), "-H", "127.0.0.1", "-p", port.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(m->pid_, m->pid_);
  return m;
}

bool MotoServer::Ready() {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    if (HttpPost(endpoint(), "/moto-api/reset-auth", "inf", "").ok()) return true;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return false;
}

std::unique_ptr<MotoServer> MotoServer::Start(const std::string& binary, const std::string& log) {
  auto m = Launch(binary, log);
  return m->Ready() ? std::move(m) : nullptr;
}

void MotoServer::Stop() {
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

std::string MotoServer::endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }

absl::StatusOr<Credentials> EnableAuth(const std::string& ep) {
  const std::string v = "&Version=2010-05-08";
  auto user = HttpPost(ep, "/", "Action=CreateUser&UserName=recal" + v, "iam");
  auto key = HttpPost(ep, "/", "Action=CreateAccessKey&UserName=recal" + v, "iam");
  const std::string policy =
      R"({"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"}]})";
  auto put_policy = HttpPost(
      ep, "/", "Action=PutUserPolicy&UserName=recal&PolicyName=s3&PolicyDocument=" + FormEncode(policy) + v, "iam");
  if (!user.ok() || !key.ok() || !put_policy.ok()) {
    return absl::InternalError(absl::StrCat("moto IAM setup failed: ", user.status().ToString(), " ",
                                            key.status().ToString(), " ", put_policy.status().ToString()));
  }
  Credentials creds{Between(*key, "<AccessKeyId>", "</AccessKeyId>"),
                    Between(*key, "<SecretAccessKey>", "</SecretAccessKey>"), ""};
  auto auth_on = HttpPost(ep, "/moto-api/reset-auth", "0", "");
  if (!auth_on.ok()) return absl::InternalError("moto reset-auth failed: " + auth_on.status().ToString());
  return creds;
}

S3ClientOptions FastClientOptions(const std::string& endpoint, Credentials credentials) {
  S3ClientOptions o;
  o.config.endpoint = *ParseEndpoint(endpoint);
  o.config.addressing = Addressing::kPath;
  o.config.credentials = std::move(credentials);
  o.retry.max_attempts = 3;
  o.retry.initial_backoff = absl::Milliseconds(20);
  o.retry.max_backoff = absl::Milliseconds(200);
  o.retry.max_total = absl::Seconds(10);
  o.connect_timeout = absl::Seconds(2);
  o.low_speed_bytes = 1;
  o.low_speed_time = absl::Seconds(10);
  return o;
}

int CountRequests(const std::string& log, const std::string& method, const std::string& target) {
  // werkzeug: 127.0.0.1 - - [date] "GET /bucket/key HTTP/1.1" 206 -
  const std::string needle = absl::StrCat("\"", method, " ", target);
  std::ifstream in(log);
  int count = 0;
  for (std::string line; std::getline(in, line);) {
    if (absl::StrContains(line, needle)) ++count;
  }
  return count;
}

}  // namespace recal::s3::testing
