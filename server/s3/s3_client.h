// A small S3 client: the object operations Recal's blob store and data sources need (HEAD,
// ranged and streamed GET, PUT, multipart upload, ListObjectsV2, DELETE), each request
// addressed and signed with SigV4 (sigv4.h), retried with bounded exponential backoff, and
// its failure mapped to an absl::Status that names the bucket, key or endpoint. The HTTP
// exchanges themselves (connection reuse, timeouts, no redirects) are http_transport.h's.
//
// Thread-safe: one client serves every thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/s3/http_transport.h"
#include "server/s3/s3_config.h"
#include "server/s3/s3_xml.h"

namespace recal::s3 {

struct RetryPolicy {
  // Attempts per call, the first included. Retried: connection failures and timeouts, 5xx,
  // 429, and 400 RequestTimeout; never a 4xx the caller must fix.
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // No retry starts after this much time since the call began (the attempt itself is
  // bounded by the timeouts below).
  absl::Duration max_total = absl::Seconds(60);
};

struct S3ClientOptions {
  S3Config config;
  RetryPolicy retry;
  absl::Duration connect_timeout = absl::Seconds(5);
  // A transfer slower than low_speed_bytes per second for low_speed_time is abandoned (and
  // retried): a hung endpoint cannot hold a caller forever, however large the object.
  int64_t low_speed_bytes = 1024;
  absl::Duration low_speed_time = absl::Seconds(30);
  // Whole-request limit; zero: none (a 10 GB upload is legitimately slow).
  absl::Duration request_timeout = absl::ZeroDuration();
};

struct ObjectMeta {
  int64_t size = 0;
  std::string etag;  // without quotes
};

struct CompletedPart {
  int part_number = 0;
  std::string etag;
};

class S3Client {
 public:
  // INVALID_ARGUMENT for a config without endpoint host or credentials.
  static absl::StatusOr<std::unique_ptr<S3Client>> Create(S3ClientOptions options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // NOT_FOUND naming s3://bucket/key (or the bucket) when absent.
  absl::StatusOr<ObjectMeta> HeadObject(absl::string_view bucket, absl::string_view key);

  // Up to out.size() bytes from offset into out; returns the count, less than out.size()
  // only where the object ends. offset == size returns 0; offset > size is OUT_OF_RANGE.
  // The response's Content-Range must describe exactly the bytes asked for (DATA_LOSS
  // otherwise), so a server that ignores Range cannot pass off the wrong bytes. A non-empty
  // if_match (an ETag from HeadObject) makes a replaced object FAILED_PRECONDITION, so that
  // reads of one object by ranges never mix two versions.
  absl::StatusOr<size_t> ReadRange(absl::string_view bucket, absl::string_view key, int64_t offset,
                                   absl::Span<char> out, absl::string_view if_match = {});
  absl::StatusOr<std::string> GetObjectRange(absl::string_view bucket, absl::string_view key, int64_t offset,
                                             int64_t length);

  // The whole object, streamed to sink. A transfer that breaks off is resumed where it
  // stopped (Range + If-Match on the first ETag, so a replaced object fails rather than
  // mixing two versions), within the retry policy.
  absl::Status GetObject(absl::string_view bucket, absl::string_view key, const ByteSink& sink);

  // Returns the new object's ETag.
  absl::StatusOr<std::string> PutObject(absl::string_view bucket, absl::string_view key, absl::string_view bytes);
  absl::StatusOr<std::string> PutObject(absl::string_view bucket, absl::string_view key, const Body& body);

  // Multipart upload. Parts are numbered 1..10000; every part but the last must be at
  // least 5 MiB (S3's rule, enforced by the server).
  absl::StatusOr<std::string> CreateMultipartUpload(absl::string_view bucket, absl::string_view key);
  absl::StatusOr<std::string> UploadPart(absl::string_view bucket, absl::string_view key,
                                         absl::string_view upload_id, int part_number, const Body& body);
  absl::StatusOr<std::string> CompleteMultipartUpload(absl::string_view bucket, absl::string_view key,
                                                      absl::string_view upload_id,
                                                      const std::vector<CompletedPart>& parts);
  absl::Status AbortMultipartUpload(absl::string_view bucket, absl::string_view key, absl::string_view upload_id);

  // The file at path as one object: a single signed PUT when it is at most part_size bytes,
  // else a multipart upload of part_size parts (raised if needed to stay within 10,000
  // parts), aborted if any step fails so that no parts are left behind. The object appears
  // only when complete: S3 never shows a half-written object. Returns the ETag.
  absl::StatusOr<std::string> UploadFile(absl::string_view bucket, absl::string_view key, const std::string& path,
                                         int64_t part_size = 64 << 20);

  // One ListObjectsV2 page (max_keys 1..1000).
  absl::StatusOr<ListPage> ListObjectsPage(absl::string_view bucket, absl::string_view prefix,
                                           absl::string_view continuation_token, int max_keys = 1000);
  // Every object under prefix, following continuation tokens, in byte-wise key order.
  absl::StatusOr<std::vector<ObjectInfo>> ListObjects(absl::string_view bucket, absl::string_view prefix,
                                                      int max_keys_per_page = 1000);

  // Deleting an absent key succeeds (S3's semantics).
  absl::Status DeleteObject(absl::string_view bucket, absl::string_view key);

  // Creates the bucket (tests, tools; the server expects its bucket to exist).
  absl::Status CreateBucket(absl::string_view bucket);

  const S3ClientOptions& options() const { return options_; }

  struct Request;  // s3_client.cc
  struct Response;

 private:
  explicit S3Client(S3ClientOptions options);
  // Runs make_request() once per attempt (so that an attempt can start from where the
  // last one stopped) with the retry policy. Transport failures are statuses; an HTTP
  // error is a Response (CheckOk turns it into a status).
  absl::StatusOr<Response> Execute(const std::function<Request()>& make_request);
  absl::StatusOr<Response> ExecuteOnce(const Request& request, bool* retryable);
  absl::Status CheckOk(const Response& response, absl::string_view what, absl::string_view bucket,
                       absl::string_view key) const;

  S3ClientOptions options_;
  HttpTransport transport_;
};

// S3's answer as a status: 404 NoSuchBucket -> NOT_FOUND naming the bucket, NoSuchKey or a
// 404 without body -> NOT_FOUND naming s3://bucket/key, 403 -> PERMISSION_DENIED, 416 ->
// OUT_OF_RANGE, 409/412 -> FAILED_PRECONDITION, 3xx -> FAILED_PRECONDITION (not
// followed), 501 -> UNIMPLEMENTED, 5xx/429 -> UNAVAILABLE, other 4xx -> INVALID_ARGUMENT;
// each message carries S3's Code and Message. Pure, for tests.
absl::Status StatusFromHttp(int http_status, const ErrorBody& error, absl::string_view what,
                            absl::string_view bucket, absl::string_view key);

// Whether a status says the bucket itself is missing (S3's NoSuchBucket), as opposed to a key
// in it: StatusFromHttp marks it with this payload (the bucket's name).
inline constexpr absl::string_view kNoSuchBucketPayload = "recal.s3/NoSuchBucket";
bool IsNoSuchBucket(const absl::Status& status);

}  // namespace recal::s3
