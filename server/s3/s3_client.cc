#include "server/s3/s3_client.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace recal::s3 {

// One HTTP request as the client sends it. Built afresh for each attempt.
struct S3Client::Request {
  std::string what;  // "GetObject": for messages
  std::string method = "GET";
  std::string bucket;
  std::string key;  // empty: a bucket-level request
  HeaderList query;
  HeaderList headers;  // signed, besides Host and the signer's own
  const Body* body = nullptr;
  bool head = false;
  // Called once, before the first byte of a 2xx body, with the status and headers; an error
  // aborts the transfer and is returned as it is (no retry).
  std::function<absl::Status(int http, const std::map<std::string, std::string>& headers)> on_headers;
  // Receives a 2xx body instead of Response::body; an error aborts (no retry).
  ByteSink sink;
  size_t max_body = kMaxXmlBytes;  // a larger buffered 2xx body is refused
  // CompleteMultipartUpload may answer 200 with an <Error> body.
  bool body_may_hold_error = false;
};

struct S3Client::Response {
  int http = 0;
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;                            // unless the request had a sink
  ErrorBody error;                             // parsed from a non-2xx body, when it parses
  int attempts = 1;
};

namespace {

// A request for an object (or, with an empty key, its bucket), the rest defaulted.
S3Client::Request NewRequest(const char* what, const char* method, absl::string_view bucket,
                             absl::string_view key) {
  S3Client::Request r;
  r.what = what;
  r.method = method;
  r.bucket = std::string(bucket);
  r.key = std::string(key);
  return r;
}

}  // namespace

namespace {

constexpr int64_t kMinPartSize = 5 << 20;
constexpr int kMaxParts = 10000;
const std::string kEmptySha256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

std::string ObjectName(absl::string_view bucket, absl::string_view key) {
  return key.empty() ? absl::StrCat("s3://", bucket) : absl::StrCat("s3://", bucket, "/", key);
}

std::string Detail(int http, const ErrorBody& e) {
  if (e.code.empty()) return absl::StrCat("HTTP ", http);
  if (e.message.empty()) return absl::StrCat(e.code, " (HTTP ", http, ")");
  return absl::StrCat(e.code, ": ", e.message, " (HTTP ", http, ")");
}

bool IsRetryableHttp(int http, const ErrorBody& e) {
  return http >= 500 ? http != 501 : http == 429 || e.code == "SlowDown" || e.code == "RequestTimeout";
}

// "bytes START-END/TOTAL" (TOTAL may be "*"); "bytes */TOTAL" gives start = end = -1.
bool ParseContentRange(absl::string_view v, int64_t* start, int64_t* end, int64_t* total) {
  if (!absl::ConsumePrefix(&v, "bytes ")) return false;
  const size_t slash = v.find('/');
  if (slash == absl::string_view::npos) return false;
  absl::string_view range = v.substr(0, slash);
  absl::string_view tot = v.substr(slash + 1);
  *total = -1;
  if (tot != "*" && !absl::SimpleAtoi(tot, total)) return false;
  if (range == "*") {
    *start = *end = -1;
    return true;
  }
  const size_t dash = range.find('-');
  return dash != absl::string_view::npos && absl::SimpleAtoi(range.substr(0, dash), start) &&
         absl::SimpleAtoi(range.substr(dash + 1), end) && *start >= 0 && *end >= *start;
}

}  // namespace

absl::Status StatusFromHttp(int http, const ErrorBody& error, absl::string_view what, absl::string_view bucket,
                            absl::string_view key) {
  const std::string name = ObjectName(bucket, key);
  const std::string detail = Detail(http, error);
  if (http == 404) {
    if (error.code == "NoSuchBucket") {
      absl::Status status =
          absl::NotFoundError(absl::StrCat(what, ": S3 bucket '", bucket, "' does not exist (", detail, ")"));
      status.SetPayload(kNoSuchBucketPayload, absl::Cord(bucket));
      return status;
    }
    if (error.code == "NoSuchUpload") {
      return absl::NotFoundError(absl::StrCat(what, ": no such multipart upload of ", name, " (", detail, ")"));
    }
    return absl::NotFoundError(absl::StrCat(what, ": ", name, " not found (", detail, ")"));
  }
  if (http == 401 || http == 403) {
    return absl::PermissionDeniedError(absl::StrCat(what, " ", name, ": access denied: ", detail));
  }
  if (http == 416) return absl::OutOfRangeError(absl::StrCat(what, " ", name, ": ", detail));
  if (http == 409 || http == 412) return absl::FailedPreconditionError(absl::StrCat(what, " ", name, ": ", detail));
  if (http >= 300 && http < 400) {
    return absl::FailedPreconditionError(absl::StrCat(what, " ", name, ": redirected (", detail,
                                                      "); redirects are never followed: check the S3 endpoint "
                                                      "and region"));
  }
  if (http == 501) return absl::UnimplementedError(absl::StrCat(what, " ", name, ": ", detail));
  if (http == 429 || http >= 500) return absl::UnavailableError(absl::StrCat(what, " ", name, ": ", detail));
  if (http >= 400) return absl::InvalidArgumentError(absl::StrCat(what, " ", name, ": ", detail));
  return absl::UnknownError(absl::StrCat(what, " ", name, ": unexpected ", detail));
}

bool IsNoSuchBucket(const absl::Status& status) {
  return absl::IsNotFound(status) && status.GetPayload(kNoSuchBucketPayload).has_value();
}

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3ClientOptions options) {
  if (options.config.endpoint.host.empty() ||
      (options.config.endpoint.scheme != "http" && options.config.endpoint.scheme != "https")) {
    return absl::InvalidArgumentError("S3 client: no endpoint (scheme and host)");
  }
  if (options.config.credentials.access_key_id.empty() || options.config.credentials.secret_access_key.empty()) {
    return absl::InvalidArgumentError("S3 client: no credentials");
  }
  if (options.retry.max_attempts < 1) options.retry.max_attempts = 1;
  return std::unique_ptr<S3Client>(new S3Client(std::move(options)));
}

S3Client::S3Client(S3ClientOptions options)
    : options_(std::move(options)),
      transport_(HttpTimeouts{options_.connect_timeout, options_.low_speed_bytes, options_.low_speed_time,
                              options_.request_timeout}) {}

S3Client::~S3Client() = default;

absl::StatusOr<S3Client::Response> S3Client::ExecuteOnce(const Request& r, bool* retryable) {
  *retryable = false;
  const S3Config& config = options_.config;
  // Virtual-host addressing puts the bucket in the host name; a bucket with dots would
  // not match the endpoint's TLS certificate there, so it always goes path-style.
  const bool virtual_host =
      config.addressing == Addressing::kVirtualHost && !r.bucket.empty() && !absl::StrContains(r.bucket, '.');
  std::string host = config.endpoint.HostHeader();
  std::string path = "/";
  if (virtual_host) {
    host = absl::StrCat(r.bucket, ".", host);
    path = absl::StrCat("/", r.key);
  } else if (!r.bucket.empty()) {
    path = r.key.empty() ? absl::StrCat("/", r.bucket) : absl::StrCat("/", r.bucket, "/", r.key);
  }

  SigningRequest sreq;
  sreq.method = r.method;
  sreq.path = path;
  sreq.query = r.query;
  sreq.headers = r.headers;
  sreq.headers.emplace_back("Host", host);
  sreq.payload_hash = r.body == nullptr ? kEmptySha256
                      : r.body->sha256_hex.empty() ? std::string(kUnsignedPayload)
                                                   : r.body->sha256_hex;
  SigningParams params{config.credentials, config.region, "s3", absl::Now()};
  RECAL_ASSIGN_OR_RETURN(SignedRequest signed_request, SignV4(sreq, params));

  HttpRequest http;
  http.what = r.key.empty() && r.bucket.empty() ? r.what : absl::StrCat(r.what, " ", ObjectName(r.bucket, r.key));
  http.peer = absl::StrCat("S3 endpoint ", config.endpoint.ToString());
  http.method = r.method;
  http.url = absl::StrCat(config.endpoint.scheme, "://", host, signed_request.encoded_path);
  if (!signed_request.encoded_query.empty()) absl::StrAppend(&http.url, "?", signed_request.encoded_query);
  for (const auto& [k, v] : sreq.headers) http.header_lines.push_back(absl::StrCat(k, ": ", v));
  for (const auto& [k, v] : signed_request.headers_to_add) http.header_lines.push_back(absl::StrCat(k, ": ", v));
  http.header_lines.push_back("Expect:");  // no 100-continue round trip before each body
  if (r.method == "POST" && r.body == nullptr) http.header_lines.push_back("Content-Type:");
  http.body = r.body;
  http.head = r.head;
  http.on_headers = r.on_headers;
  http.sink = r.sink;
  http.max_body = r.max_body;

  RECAL_ASSIGN_OR_RETURN(HttpResponse exchanged, transport_.Perform(http, retryable));
  Response resp;
  resp.http = exchanged.http;
  resp.headers = std::move(exchanged.headers);
  resp.body = std::move(exchanged.body);
  if (resp.http < 200 || resp.http >= 300) {
    if (auto e = ParseErrorBody(resp.body); e.ok()) resp.error = *std::move(e);
  } else if (r.body_may_hold_error) {
    if (auto e = ParseErrorBody(resp.body); e.ok()) {
      resp.error = *std::move(e);
      resp.http = resp.error.code == "InternalError" || resp.error.code == "SlowDown" ? 500 : 400;
    }
  }
  *retryable = IsRetryableHttp(resp.http, resp.error);
  return resp;
}

absl::StatusOr<S3Client::Response> S3Client::Execute(const std::function<Request()>& make_request) {
  const RetryPolicy& policy = options_.retry;
  const absl::Time start = absl::Now();
  thread_local absl::BitGen rng;
  absl::Duration backoff = policy.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    const Request request = make_request();
    bool retryable = false;
    absl::StatusOr<Response> result = ExecuteOnce(request, &retryable);
    if (result.ok()) result->attempts = attempt;
    if (!retryable || attempt >= policy.max_attempts) {
      if (!result.ok() && retryable) {
        return absl::UnavailableError(absl::StrCat(result.status().message(), " (after ", attempt, " attempts)"));
      }
      return result;
    }
    // Exponential backoff with jitter in [backoff/2, backoff]: spreads the retries of many
    // clients that a throttling endpoint (503 SlowDown) turned away at the same moment.
    const absl::Duration sleep = backoff / 2 + absl::Uniform(rng, 0.0, 0.5) * backoff;
    if (absl::Now() - start + sleep > policy.max_total) {
      if (!result.ok()) {
        return absl::UnavailableError(absl::StrCat(result.status().message(), " (gave up after ", attempt,
                                                   " attempts in ", absl::FormatDuration(absl::Now() - start), ")"));
      }
      return result;
    }
    absl::SleepFor(sleep);
    backoff = std::min(backoff * 2, policy.max_backoff);
  }
}

absl::Status S3Client::CheckOk(const Response& response, absl::string_view what, absl::string_view bucket,
                               absl::string_view key) const {
  if (response.http >= 200 && response.http < 300) return absl::OkStatus();
  absl::Status st = StatusFromHttp(response.http, response.error, what, bucket, key);
  if (absl::IsUnavailable(st)) {
    return absl::UnavailableError(absl::StrCat(st.message(), " from S3 endpoint ", options_.config.endpoint.ToString(),
                                               " (after ", response.attempts, " attempts)"));
  }
  return st;
}

namespace {

absl::Status CheckNames(absl::string_view bucket, absl::string_view key) {
  RECAL_RETURN_IF_ERROR(ValidateBucketName(bucket));
  return ValidateObjectKey(key);
}

}  // namespace

absl::StatusOr<ObjectMeta> S3Client::HeadObject(absl::string_view bucket, absl::string_view key) {
  RECAL_RETURN_IF_ERROR(CheckNames(bucket, key));
  RECAL_ASSIGN_OR_RETURN(Response resp, Execute([&] {
                           Request r = NewRequest("HeadObject", "HEAD", bucket, key);
                           r.head = true;
                           return r;
                         }));
  if (resp.http == 404) {
    // A HEAD answer has no body to say whether the key or the bucket is missing: ask.
    RECAL_ASSIGN_OR_RETURN(Response b, Execute([&] {
                             Request r = NewRequest("HeadBucket", "HEAD", bucket, "");
                             r.head = true;
                             return r;
                           }));
    if (b.http == 404) b.error.code = "NoSuchBucket";
    if (b.http == 404) return CheckOk(b, "HeadObject", bucket, key);
  }
  RECAL_RETURN_IF_ERROR(CheckOk(resp, "HeadObject", bucket, key));
  ObjectMeta meta;
  if (!absl::SimpleAtoi(resp.headers["content-length"], &meta.size) || meta.size < 0) {
    return absl::DataLossError(absl::StrCat("HeadObject ", ObjectName(bucket, key), ": no valid Content-Length"));
  }
  meta.etag = StripEtagQuotes(resp.headers["etag"]);
  return meta;
}

absl::StatusOr<size_t> S3Client::ReadRange(absl::string_view bucket, absl::string_view key, int64_t offset,
                                           absl::Span<char> out, absl::string_view if_match) {
  RECAL_RETURN_IF_ERROR(CheckNames(bucket, key));
  if (offset < 0) return absl::InvalidArgumentError(absl::StrCat("ReadRange: negative offset ", offset));
  if (out.empty()) return 0;
  const std::string name = ObjectName(bucket, key);
  const int64_t last = offset + static_cast<int64_t>(out.size()) - 1;
  size_t filled = 0;
  RECAL_ASSIGN_OR_RETURN(Response resp, Execute([&] {
                           filled = 0;  // a retry starts over
                           Request r = NewRequest("GetObject", "GET", bucket, key);
                           r.headers.emplace_back("Range", absl::StrCat("bytes=", offset, "-", last));
                           if (!if_match.empty()) r.headers.emplace_back("If-Match", absl::StrCat("\"", if_match, "\""));
                           // Checked before a byte lands in out: the bytes must be exactly those asked
                           // for, short only where the object ends.
                           r.on_headers = [&, name](int http, const std::map<std::string, std::string>& h)
                               -> absl::Status {
                             if (http == 200) {
                               // A server that ignored Range sends the whole object: acceptable only
                               // from offset 0 and if it fits (checked by the sink).
                               if (offset == 0) return absl::OkStatus();
                               return absl::DataLossError(absl::StrCat("GetObject ", name, ": the endpoint ignored Range ",
                                                                       offset, "-", last));
                             }
                             int64_t s = 0, e = 0, total = 0;
                             auto it = h.find("content-range");
                             if (it == h.end() || !ParseContentRange(it->second, &s, &e, &total) || s != offset ||
                                 e > last || (e < last && total != -1 && e != total - 1)) {
                               return absl::DataLossError(absl::StrCat(
                                   "GetObject ", name, ": asked for bytes ", offset, "-", last, ", got Content-Range '",
                                   it == h.end() ? "" : it->second, "'"));
                             }
                             return absl::OkStatus();
                           };
                           r.sink = [&, name](absl::string_view piece) -> absl::Status {
                             if (piece.size() > out.size() - filled) {
                               return absl::DataLossError(absl::StrCat("GetObject ", name, ": more bytes than the ",
                                                                       out.size(), " asked for at offset ", offset));
                             }
                             std::memcpy(out.data() + filled, piece.data(), piece.size());
                             filled += piece.size();
                             return absl::OkStatus();
                           };
                           return r;
                         }));
  if (resp.http == 416) {
    // "bytes */SIZE": reading at exactly the end is an empty read, not an error.
    int64_t s = 0, e = 0, total = -1;
    auto it = resp.headers.find("content-range");
    if (it == resp.headers.end() || !ParseContentRange(it->second, &s, &e, &total)) {
      // No "bytes */SIZE" (moto, some S3-compatibles): the size decides between an empty
      // read at the end and a read past it.
      if (auto meta = HeadObject(bucket, key); meta.ok()) total = meta->size;
    }
    if (total == offset) return 0;
    return absl::OutOfRangeError(absl::StrCat("GetObject ", name, ": offset ", offset, " is past the end",
                                              total >= 0 ? absl::StrCat(" (", total, " bytes)") : std::string()));
  }
  RECAL_RETURN_IF_ERROR(CheckOk(resp, "GetObject", bucket, key));
  if (resp.http == 206) {
    int64_t s = 0, e = 0, total = 0;
    ParseContentRange(resp.headers["content-range"], &s, &e, &total);
    if (static_cast<int64_t>(filled) != e - s + 1) {
      return absl::DataLossError(absl::StrCat("GetObject ", name, ": ", filled, " bytes for Content-Range ",
                                              resp.headers["content-range"]));
    }
  }
  return filled;
}

absl::StatusOr<std::string> S3Client::GetObjectRange(absl::string_view bucket, absl::string_view key, int64_t offset,
                                                     int64_t length) {
  if (length < 0 || length > (int64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat("GetObjectRange: length ", length));
  }
  std::string out(static_cast<size_t>(length), '\0');
  RECAL_ASSIGN_OR_RETURN(size_t n, ReadRange(bucket, key, offset, absl::MakeSpan(out)));
  out.resize(n);
  return out;
}

absl::Status S3Client::GetObject(absl::string_view bucket, absl::string_view key, const ByteSink& sink) {
  RECAL_RETURN_IF_ERROR(CheckNames(bucket, key));
  const std::string name = ObjectName(bucket, key);
  int64_t delivered = 0;
  int64_t total = -1;
  std::string etag;
  RECAL_ASSIGN_OR_RETURN(Response resp, Execute([&] {
                           Request r = NewRequest("GetObject", "GET", bucket, key);
                           const int64_t resume_at = delivered;
                           if (resume_at > 0) {
                             // Resume where the broken transfer stopped, from the same version.
                             r.headers.emplace_back("Range", absl::StrCat("bytes=", resume_at, "-"));
                             if (!etag.empty()) r.headers.emplace_back("If-Match", absl::StrCat("\"", etag, "\""));
                           }
                           r.on_headers = [&, resume_at, name](int http, const std::map<std::string, std::string>& h)
                               -> absl::Status {
                             if (resume_at == 0) {
                               auto len = h.find("content-length");
                               if (http != 200 || len == h.end() || !absl::SimpleAtoi(len->second, &total)) {
                                 return absl::DataLossError(absl::StrCat("GetObject ", name, ": HTTP ", http,
                                                                         " without a Content-Length"));
                               }
                               if (auto e = h.find("etag"); e != h.end()) etag = StripEtagQuotes(e->second);
                               return absl::OkStatus();
                             }
                             int64_t s = 0, e = 0, t = 0;
                             auto it = h.find("content-range");
                             if (http != 206 || it == h.end() || !ParseContentRange(it->second, &s, &e, &t) ||
                                 s != resume_at || (t != -1 && t != total)) {
                               return absl::DataLossError(absl::StrCat("GetObject ", name, ": resuming at ", resume_at,
                                                                       " got HTTP ", http));
                             }
                             return absl::OkStatus();
                           };
                           r.sink = [&](absl::string_view piece) -> absl::Status {
                             if (total >= 0 && delivered + static_cast<int64_t>(piece.size()) > total) {
                               return absl::DataLossError(absl::StrCat("GetObject ", name, ": more than ", total, " bytes"));
                             }
                             delivered += static_cast<int64_t>(piece.size());
                             return sink(piece);
                           };
                           return r;
                         }));
  if (resp.http == 412) {
    return absl::AbortedError(absl::StrCat("GetObject ", name, ": the object changed while it was downloaded"));
  }
  RECAL_RETURN_IF_ERROR(CheckOk(resp, "GetObject", bucket, key));
  if (total < 0) total = 0;  // an empty body never reached on_headers
  if (delivered != total) {
    return absl::DataLossError(absl::StrCat("GetObject ", name, ": got ", delivered, " of ", total, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> S3Client::PutObject(absl::string_view bucket, absl::string_view key,
                                                absl::string_view bytes) {
  return PutObject(bucket, key, BodyFromBytes(bytes));
}

absl::StatusOr<std::string> S3Client::PutObject(absl::string_view bucket, absl::string_view key, const Body& body) {
  RECAL_RETURN_IF_ERROR(CheckNames(bucket, key));
  RECAL_ASSIGN_OR_RETURN(Response resp, Execute([&] {
                           Request r = NewRequest("PutObject", "PUT", bucket, key);
                           r.body = &body;
                           return r;
                         }));
  RECAL_RETURN_IF_ERROR(CheckOk(resp, "PutObject", bucket, key));
  return StripEtagQuotes(resp.headers["etag"]);
}

absl::StatusOr<std::string> S3Client::CreateMultipartUpload(absl::string_view bucket, absl::string_view key) {
  RECAL_RETURN_IF_ERROR(CheckNames(bucket, key));
  RECAL_ASSIGN_OR_RETURN(Response resp, Execute([&] {
                           Request r = NewRequest("CreateMultipartUpload", "POST", bucket, key);
                           r.query = {{"uploads", ""}};
                           return r;
                         }));
  RECAL_RETURN_IF_ERROR(CheckOk(resp, "CreateMultipartUpload", bucket, key));
  return ParseInitiateMultipartUploadResult(resp.body);
}

absl::StatusOr<std::string> S3Client::UploadPart(absl::string_view bucket, absl::string_view key,
                                                 absl::string_view upload_id, int part_number, const Body& body) {
  RECAL_RETURN_IF_ERROR(CheckNames(bucket, key));
  if (part_number < 1 || part_number > kMaxParts) {
    return absl::InvalidArgumentError(absl::StrCat("UploadPart: part number ", part_number, " outside 1..", kMaxParts));
  }
  RECAL_ASSIGN_OR_RETURN(Response resp, Execute([&] {
                           Request r = NewRequest("", "PUT", bucket, key);
                           r.what = absl::StrCat("UploadPart ", part_number, " of");
                           r.query = {{"partNumber", absl::StrCat(part_number)}, {"uploadId", std::string(upload_id)}};
                           r.body = &body;
                           return r;
                         }));
  RECAL_RETURN_IF_ERROR(CheckOk(resp, "UploadPart", bucket, key));
  std::string etag = StripEtagQuotes(resp.headers["etag"]);
  if (etag.empty()) return absl::DataLossError(absl::StrCat("UploadPart ", part_number, ": no ETag in the answer"));
  return etag;
}

absl::StatusOr<std::string> S3Client::CompleteMultipartUpload(absl::string_view bucket, absl::string_view key,
                                                              absl::string_view upload_id,
                                                              const std::vector<CompletedPart>& parts) {
  RECAL_RETURN_IF_ERROR(CheckNames(bucket, key));
  std::string xml = "<CompleteMultipartUpload>";
  for (const CompletedPart& p : parts) {
    absl::StrAppend(&xml, "<Part><PartNumber>", p.part_number, "</PartNumber><ETag>",
                    XmlEscape(absl::StrCat("\"", p.etag, "\"")), "</ETag></Part>");
  }
  xml += "</CompleteMultipartUpload>";
  const Body body = BodyFromBytes(xml);
  RECAL_ASSIGN_OR_RETURN(Response resp, Execute([&] {
                           Request r = NewRequest("CompleteMultipartUpload", "POST", bucket, key);
                           r.query = {{"uploadId", std::string(upload_id)}};
                           r.headers = {{"Content-Type", "application/xml"}};
                           r.body = &body;
                           r.body_may_hold_error = true;
                           return r;
                         }));
  RECAL_RETURN_IF_ERROR(CheckOk(resp, "CompleteMultipartUpload", bucket, key));
  RECAL_ASSIGN_OR_RETURN(CompleteResult result, ParseCompleteMultipartUploadResult(resp.body));
  return result.etag;
}

absl::Status S3Client::AbortMultipartUpload(absl::string_view bucket, absl::string_view key,
                                            absl::string_view upload_id) {
  RECAL_RETURN_IF_ERROR(CheckNames(bucket, key));
  RECAL_ASSIGN_OR_RETURN(Response resp, Execute([&] {
                           Request r = NewRequest("AbortMultipartUpload", "DELETE", bucket, key);
                           r.query = {{"uploadId", std::string(upload_id)}};
                           return r;
                         }));
  return CheckOk(resp, "AbortMultipartUpload", bucket, key);
}

absl::StatusOr<std::string> S3Client::UploadFile(absl::string_view bucket, absl::string_view key,
                                                 const std::string& path, int64_t part_size) {
  RECAL_RETURN_IF_ERROR(CheckNames(bucket, key));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("stat ", path));
  const int64_t size = st.st_size;
  if (size <= part_size) {
    RECAL_ASSIGN_OR_RETURN(Body body, BodyFromFile(path, 0, size));
    return PutObject(bucket, key, body);
  }
  if (part_size < kMinPartSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("UploadFile: part size ", part_size, " is below S3's minimum of ", kMinPartSize));
  }
  part_size = std::max(part_size, (size + kMaxParts - 1) / kMaxParts);
  RECAL_ASSIGN_OR_RETURN(std::string upload_id, CreateMultipartUpload(bucket, key));
  std::vector<CompletedPart> parts;
  absl::StatusOr<std::string> etag = [&]() -> absl::StatusOr<std::string> {
    for (int64_t offset = 0; offset < size; offset += part_size) {
      const int number = static_cast<int>(parts.size()) + 1;
      RECAL_ASSIGN_OR_RETURN(Body body, BodyFromFile(path, offset, std::min(part_size, size - offset)));
      RECAL_ASSIGN_OR_RETURN(std::string part_etag, UploadPart(bucket, key, upload_id, number, body));
      parts.push_back({number, std::move(part_etag)});
    }
    return CompleteMultipartUpload(bucket, key, upload_id, parts);
  }();
  if (!etag.ok()) {
    // Parts of an upload never completed are stored (and billed) until aborted.
    if (absl::Status abort = AbortMultipartUpload(bucket, key, upload_id); !abort.ok()) {
      return absl::Status(etag.status().code(), absl::StrCat(etag.status().message(), "; aborting upload ", upload_id,
                                                             " failed too: ", abort.message()));
    }
  }
  return etag;
}

absl::StatusOr<ListPage> S3Client::ListObjectsPage(absl::string_view bucket, absl::string_view prefix,
                                                   absl::string_view continuation_token, int max_keys) {
  RECAL_RETURN_IF_ERROR(ValidateBucketName(bucket));
  if (max_keys < 1 || max_keys > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("ListObjects: max_keys ", max_keys, " outside 1..1000"));
  }
  RECAL_ASSIGN_OR_RETURN(Response resp, Execute([&] {
                           Request r = NewRequest("ListObjectsV2", "GET", bucket, "");
                           r.query = {{"list-type", "2"}, {"max-keys", absl::StrCat(max_keys)}};
                           if (!prefix.empty()) r.query.emplace_back("prefix", std::string(prefix));
                           if (!continuation_token.empty()) {
                             r.query.emplace_back("continuation-token", std::string(continuation_token));
                           }
                           return r;
                         }));
  RECAL_RETURN_IF_ERROR(CheckOk(resp, "ListObjectsV2", bucket, ""));
  return ParseListBucketResult(resp.body);
}

absl::StatusOr<std::vector<ObjectInfo>> S3Client::ListObjects(absl::string_view bucket, absl::string_view prefix,
                                                              int max_keys_per_page) {
  std::vector<ObjectInfo> all;
  std::string token;
  for (int page_number = 1;; ++page_number) {
    RECAL_ASSIGN_OR_RETURN(ListPage page, ListObjectsPage(bucket, prefix, token, max_keys_per_page));
    for (ObjectInfo& o : page.objects) all.push_back(std::move(o));
    if (!page.is_truncated) break;
    // A truncated page must move on: no token, or the same token again, would loop forever.
    if (page.next_continuation_token.empty() || page.next_continuation_token == token) {
      return absl::DataLossError(absl::StrCat("ListObjectsV2 s3://", bucket, "/", prefix, ": page ", page_number,
                                              " is truncated without a new continuation token"));
    }
    token = std::move(page.next_continuation_token);
  }
  // S3 lists in UTF-8 byte order already; sorting here makes that a guarantee for the
  // S3-compatible servers that do not, and drops duplicates a buggy pagination repeats.
  std::sort(all.begin(), all.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  all.erase(std::unique(all.begin(), all.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.key == b.key; }),
            all.end());
  return all;
}

absl::Status S3Client::DeleteObject(absl::string_view bucket, absl::string_view key) {
  RECAL_RETURN_IF_ERROR(CheckNames(bucket, key));
  RECAL_ASSIGN_OR_RETURN(Response resp, Execute([&] {
                           Request r = NewRequest("DeleteObject", "DELETE", bucket, key);
                           return r;
                         }));
  return CheckOk(resp, "DeleteObject", bucket, key);
}

absl::Status S3Client::CreateBucket(absl::string_view bucket) {
  RECAL_RETURN_IF_ERROR(ValidateBucketName(bucket));
  // Outside us-east-1 S3 wants the region named in the body.
  const std::string xml =
      options_.config.region == "us-east-1"
          ? std::string()
          : absl::StrCat("<CreateBucketConfiguration><LocationConstraint>", XmlEscape(options_.config.region),
                         "</LocationConstraint></CreateBucketConfiguration>");
  const Body body = BodyFromBytes(xml);
  RECAL_ASSIGN_OR_RETURN(Response resp, Execute([&] {
                           Request r = NewRequest("CreateBucket", "PUT", bucket, "");
                           if (!xml.empty()) r.body = &body;
                           return r;
                         }));
  if (resp.http == 409 && resp.error.code == "BucketAlreadyOwnedByYou") return absl::OkStatus();
  return CheckOk(resp, "CreateBucket", bucket, "");
}

}  // namespace recal::s3
