// The S3 client (server/s3/s3_client.cc) over real HTTP:
//  - S3ClientMoto: against moto_server, a real S3-compatible server started on loopback by
//    the test, with its IAM authentication switched on, so every request's SigV4 signature
//    is checked by an independent implementation (botocore's). Skipped, saying so, where
//    moto_server is not on PATH.
//  - S3ClientFault: against a scripted server in the test: 503 SlowDown then success, retries
//    running out, redirects not followed, a Content-Range that lies, a download cut short and
//    resumed, an endpoint that accepts and never answers, one that refuses connections.
#include "server/s3/s3_client.h"

#include <curl/curl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "tests/s3/moto_server.h"
#include "tests/s3/test_http_server.h"
#include "tests/test_util.h"

namespace recal::s3 {
namespace {

using recal::testing::TempDir;
using recal::testing::WriteBytes;
using testing::FindOnPath;
using testing::HttpReply;
using testing::MotoServer;
using testing::ScriptedHttpServer;
using testing::ScriptedReply;

std::string Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

constexpr char kBucket[] = "recal-test";

class S3ClientMoto : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    binary_ = new std::string(FindOnPath("moto_server"));
    if (binary_->empty()) return;
    tmp_ = new TempDir;
    // Two servers, started together: moto_ with authentication off for the functional
    // tests, moto_auth_ with it on. moto's own signature check (botocore's S3SigV4Auth over
    // a URL that werkzeug re-quotes) refuses even botocore's signatures for keys with
    // $ + = & or non-ASCII and for a list prefix with '/', so only requests free of those
    // go to moto_auth_; the encoding of the rest is checked by AWS's vectors (sigv4_test.cc).
    auto plain = MotoServer::Launch(*binary_, tmp_->File("moto.log"));
    auto auth = MotoServer::Launch(*binary_, tmp_->File("moto_auth.log"));
    if (!plain->Ready() || !auth->Ready()) {
      setup_error_ = new std::string("moto_server did not start; see its logs in " + tmp_->path());
      return;
    }
    moto_ = plain.release();
    moto_auth_ = auth.release();
    absl::StatusOr<Credentials> creds = testing::EnableAuth(moto_auth_->endpoint());
    if (!creds.ok()) {
      setup_error_ = new std::string(creds.status().ToString());
      return;
    }
    creds_ = new Credentials(*std::move(creds));
  }

  static void TearDownTestSuite() {
    delete moto_;
    moto_ = nullptr;
    delete moto_auth_;
    moto_auth_ = nullptr;
    delete tmp_;
    tmp_ = nullptr;
  }

  void SetUp() override {
    if (binary_->empty()) GTEST_SKIP() << "moto_server not installed: S3 tests skipped";
    ASSERT_EQ(setup_error_, nullptr) << *setup_error_;
    ASSERT_FALSE(creds_->access_key_id.empty());
    auto c = S3Client::Create(testing::FastClientOptions(moto_->endpoint(), {"AKIAEXAMPLE", "unchecked", ""}));
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    ASSERT_TRUE(client_->CreateBucket(kBucket).ok());
    c = S3Client::Create(testing::FastClientOptions(moto_auth_->endpoint(), *creds_));
    ASSERT_TRUE(c.ok()) << c.status();
    auth_client_ = *std::move(c);
    absl::Status created = auth_client_->CreateBucket(kBucket);
    ASSERT_TRUE(created.ok()) << created;
  }

  static std::string* binary_;
  static std::string* setup_error_;
  static TempDir* tmp_;
  static MotoServer* moto_;
  static MotoServer* moto_auth_;
  static Credentials* creds_;
  std::unique_ptr<S3Client> client_;       // moto_: authentication off
  std::unique_ptr<S3Client> auth_client_;  // moto_auth_: every signature checked
};

std::string* S3ClientMoto::binary_ = nullptr;
std::string* S3ClientMoto::setup_error_ = nullptr;
TempDir* S3ClientMoto::tmp_ = nullptr;
MotoServer* S3ClientMoto::moto_ = nullptr;
MotoServer* S3ClientMoto::moto_auth_ = nullptr;
Credentials* S3ClientMoto::creds_ = nullptr;

std::string Download(S3Client& c, absl::string_view bucket, absl::string_view key, absl::Status* st) {
  std::string out;
  *st = c.GetObject(bucket, key, [&](absl::string_view piece) {
    out.append(piece.data(), piece.size());
    return absl::OkStatus();
  });
  return out;
}

TEST_F(S3ClientMoto, PutGetHeadDelete) {
  // Keys whose path needs encoding: the signature covers the encoded path.
  for (const std::string key : {"a/plain.bin", "dir/with space/$x+y=z&w.bin", "unicode/\xC3\xA9t\xC3\xA9.bin"}) {
    const std::string data = Pattern(3000, 1);
    auto etag = client_->PutObject(kBucket, key, data);
    ASSERT_TRUE(etag.ok()) << key << ": " << etag.status();
    auto meta = client_->HeadObject(kBucket, key);
    ASSERT_TRUE(meta.ok()) << meta.status();
    EXPECT_EQ(meta->size, 3000);
    EXPECT_EQ(meta->etag, *etag);
    absl::Status st;
    EXPECT_EQ(Download(*client_, kBucket, key, &st), data) << key;
    EXPECT_TRUE(st.ok()) << st;
    ASSERT_TRUE(client_->DeleteObject(kBucket, key).ok());
    EXPECT_EQ(client_->HeadObject(kBucket, key).status().code(), absl::StatusCode::kNotFound);
  }
  // An empty object.
  ASSERT_TRUE(client_->PutObject(kBucket, "empty", "").ok());
  EXPECT_EQ(client_->HeadObject(kBucket, "empty")->size, 0);
  absl::Status st;
  EXPECT_EQ(Download(*client_, kBucket, "empty", &st), "");
  EXPECT_TRUE(st.ok()) << st;
}

TEST_F(S3ClientMoto, RangedReads) {
  const std::string data = Pattern(1000, 2);
  ASSERT_TRUE(client_->PutObject(kBucket, "ranged", data).ok());
  struct Case {
    int64_t offset, length;
  };
  for (Case c : {Case{0, 10}, Case{0, 1000}, Case{500, 100}, Case{999, 1}, Case{990, 100}, Case{1, 5000}}) {
    auto got = client_->GetObjectRange(kBucket, "ranged", c.offset, c.length);
    ASSERT_TRUE(got.ok()) << c.offset << "+" << c.length << ": " << got.status();
    EXPECT_EQ(*got, data.substr(c.offset, c.length)) << c.offset << "+" << c.length;
  }
  auto at_end = client_->GetObjectRange(kBucket, "ranged", 1000, 10);
  ASSERT_TRUE(at_end.ok()) << at_end.status();
  EXPECT_EQ(*at_end, "");
  auto past = client_->GetObjectRange(kBucket, "ranged", 1001, 10);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange) << past.status();
  EXPECT_EQ(*client_->GetObjectRange(kBucket, "ranged", 5, 0), "");
}

TEST_F(S3ClientMoto, MultipartUploadFileMatchesSha256) {
  TempDir dir;
  const int64_t part = 5 << 20;  // moto, like S3, wants parts of at least 5 MiB but the last
  const std::string data = Pattern(static_cast<size_t>(2 * part + 123457), 3);
  WriteBytes(dir.File("big.bin"), data);
  auto etag = client_->UploadFile(kBucket, "multi/big.bin", dir.File("big.bin"), part);
  ASSERT_TRUE(etag.ok()) << etag.status();
  EXPECT_TRUE(absl::EndsWith(*etag, "-3")) << *etag;  // three parts
  auto meta = client_->HeadObject(kBucket, "multi/big.bin");
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->size, static_cast<int64_t>(data.size()));
  Sha256 hash;
  ASSERT_TRUE(client_->GetObject(kBucket, "multi/big.bin", [&](absl::string_view piece) {
                hash.Update(piece);
                return absl::OkStatus();
              }).ok());
  EXPECT_EQ(hash.HexDigest(), Sha256Hex(data));

  // Below the threshold: one PUT (a plain ETag, no "-N").
  WriteBytes(dir.File("small.bin"), "small");
  auto small = client_->UploadFile(kBucket, "multi/small.bin", dir.File("small.bin"), part);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_FALSE(absl::StrContains(*small, "-"));
  EXPECT_EQ(*client_->GetObjectRange(kBucket, "multi/small.bin", 0, 100), "small");

  // Parts below S3's minimum are refused before anything is sent.
  EXPECT_EQ(client_->UploadFile(kBucket, "multi/x", dir.File("big.bin"), 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(S3ClientMoto, AbortedUploadLeavesNothing) {
  auto id = client_->CreateMultipartUpload(kBucket, "aborted");
  ASSERT_TRUE(id.ok()) << id.status();
  const std::string part = Pattern(1000, 4);
  const Body body = BodyFromBytes(part);
  auto etag = client_->UploadPart(kBucket, "aborted", *id, 1, body);
  ASSERT_TRUE(etag.ok()) << etag.status();
  ASSERT_TRUE(client_->AbortMultipartUpload(kBucket, "aborted", *id).ok());
  EXPECT_EQ(client_->HeadObject(kBucket, "aborted").status().code(), absl::StatusCode::kNotFound);
  // The upload is gone: S3 answers 404 NoSuchUpload (NOT_FOUND, see S3ClientStatus);
  // moto 5 answers 500, so only the failure is checked here.
  auto again = client_->UploadPart(kBucket, "aborted", *id, 2, body);
  EXPECT_FALSE(again.ok());
  auto complete = client_->CompleteMultipartUpload(kBucket, "aborted", *id, {{1, *etag}});
  EXPECT_FALSE(complete.ok()) << complete.status();
  EXPECT_EQ(client_->HeadObject(kBucket, "aborted").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(S3ClientMoto, ListPaginates) {
  std::vector<std::string> keys;
  for (int i = 0; i < 23; ++i) keys.push_back(absl::StrCat("list/k", (i * 7) % 23, i % 2 ? "/x y" : ""));
  for (const std::string& k : keys) ASSERT_TRUE(client_->PutObject(kBucket, k, k).ok()) << k;
  ASSERT_TRUE(client_->PutObject(kBucket, "listing-other", "x").ok());  // shares "list" but not "list/"
  std::sort(keys.begin(), keys.end());

  auto first = client_->ListObjectsPage(kBucket, "list/", "", 5);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->objects.size(), 5u);
  EXPECT_TRUE(first->is_truncated);
  EXPECT_FALSE(first->next_continuation_token.empty());

  auto all = client_->ListObjects(kBucket, "list/", 5);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ((*all)[i].key, keys[i]);
    EXPECT_EQ((*all)[i].size, static_cast<int64_t>(keys[i].size()));
  }
  auto none = client_->ListObjects(kBucket, "nothing-here/");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_F(S3ClientMoto, MissingBucketAndKeyAreNotFoundNamingThem) {
  auto head = client_->HeadObject("no-such-bucket", "k");
  EXPECT_EQ(head.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(head.status().message(), "no-such-bucket")) << head.status();
  auto get = client_->GetObjectRange("no-such-bucket", "k", 0, 10);
  EXPECT_EQ(get.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(get.status().message(), "bucket 'no-such-bucket'")) << get.status();
  auto list = client_->ListObjects("no-such-bucket", "");
  EXPECT_EQ(list.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(list.status().message(), "no-such-bucket")) << list.status();

  auto key = client_->HeadObject(kBucket, "missing/key");
  EXPECT_EQ(key.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(key.status().message(), "s3://recal-test/missing/key")) << key.status();
  absl::Status st;
  Download(*client_, kBucket, "missing/key", &st);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(st.message(), "NoSuchKey")) << st;
}

// Every operation, with its query parameters, headers and payload hashes, signed as moto
// (with authentication on) verifies it.
TEST_F(S3ClientMoto, SignaturesAreVerified) {
  S3Client& c = *auth_client_;
  const std::string data = Pattern(2000, 5);
  ASSERT_TRUE(c.PutObject(kBucket, "auth/a_b-c.d", data).ok());
  auto meta = c.HeadObject(kBucket, "auth/a_b-c.d");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->size, 2000);
  EXPECT_EQ(*c.GetObjectRange(kBucket, "auth/a_b-c.d", 1990, 100), data.substr(1990));
  absl::Status st;
  EXPECT_EQ(Download(c, kBucket, "auth/a_b-c.d", &st), data);
  EXPECT_TRUE(st.ok()) << st;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(c.PutObject(kBucket, absl::StrCat("authlist", i), "x").ok());
  auto list = c.ListObjects(kBucket, "authlist", 3);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->size(), 4u);
  // Multipart: one part (the last may be small), query parameters uploads/uploadId/partNumber.
  auto id = c.CreateMultipartUpload(kBucket, "auth/multi");
  ASSERT_TRUE(id.ok()) << id.status();
  const Body body = BodyFromBytes(data);
  auto part = c.UploadPart(kBucket, "auth/multi", *id, 1, body);
  ASSERT_TRUE(part.ok()) << part.status();
  auto done = c.CompleteMultipartUpload(kBucket, "auth/multi", *id, {{1, *part}});
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(*c.GetObjectRange(kBucket, "auth/multi", 0, 5000), data);
  auto other = c.CreateMultipartUpload(kBucket, "auth/aborted");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(c.AbortMultipartUpload(kBucket, "auth/aborted", *other).ok());
  EXPECT_TRUE(c.DeleteObject(kBucket, "auth/multi").ok());
}

TEST_F(S3ClientMoto, BadCredentialsArePermissionDenied) {
  ASSERT_TRUE(auth_client_->PutObject(kBucket, "secret", "x").ok());
  Credentials wrong = *creds_;
  wrong.secret_access_key += "x";
  auto c = S3Client::Create(testing::FastClientOptions(moto_auth_->endpoint(), wrong));
  ASSERT_TRUE(c.ok());
  auto got = (*c)->GetObjectRange(kBucket, "secret", 0, 1);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kPermissionDenied) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "SignatureDoesNotMatch")) << got.status();

  Credentials unknown{"AKIAUNKNOWNKEY000000", "whatever", ""};
  c = S3Client::Create(testing::FastClientOptions(moto_auth_->endpoint(), unknown));
  ASSERT_TRUE(c.ok());
  auto put = (*c)->PutObject(kBucket, "secret", "y");
  EXPECT_EQ(put.status().code(), absl::StatusCode::kPermissionDenied) << put.status();
  EXPECT_TRUE(absl::StrContains(put.status().message(), "InvalidAccessKeyId")) << put.status();
  EXPECT_EQ(*auth_client_->GetObjectRange(kBucket, "secret", 0, 10), "x");  // unchanged
}

TEST_F(S3ClientMoto, StoppedEndpointIsUnavailableWithinBoundedTime) {
  // Its own moto (authentication off): this test stops it.
  auto moto = MotoServer::Start(*binary_, tmp_->File("moto2.log"));
  ASSERT_NE(moto, nullptr);
  auto c = S3Client::Create(testing::FastClientOptions(moto->endpoint(), {"AKIAEXAMPLE", "secret", ""}));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->CreateBucket(kBucket).ok());
  ASSERT_TRUE((*c)->PutObject(kBucket, "k", "v").ok());
  moto->Stop();
  const absl::Time start = absl::Now();
  auto got = (*c)->GetObjectRange(kBucket, "k", 0, 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), moto->endpoint())) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "3 attempts")) << got.status();
}

// ---------------------------------------------------------------- scripted faults

class S3ClientFault : public ::testing::Test {
 protected:
  std::unique_ptr<S3Client> Client(const std::string& endpoint, int max_attempts = 3) {
    S3ClientOptions o = testing::FastClientOptions(endpoint, {"AKIDEXAMPLE", "secret", ""});
    o.retry.max_attempts = max_attempts;
    auto c = S3Client::Create(o);
    EXPECT_TRUE(c.ok());
    return c.ok() ? *std::move(c) : nullptr;
  }
  static ScriptedReply SlowDown() {
    return {HttpReply(503, {}, "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>")};
  }
  ScriptedHttpServer server_;
};

TEST_F(S3ClientFault, SlowDownIsRetriedThenSucceeds) {
  server_.Script({SlowDown(), SlowDown(), {HttpReply(206, {{"Content-Range", "bytes 0-4/100"}}, "hello")}});
  auto got = Client(server_.endpoint())->GetObjectRange("bkt", "a/k", 0, 5);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "hello");
  auto reqs = server_.requests();
  ASSERT_EQ(reqs.size(), 3u);
  for (const auto& r : reqs) {
    EXPECT_EQ(r.target, "/bkt/a/k");
    EXPECT_EQ(r.headers.at("range"), "bytes=0-4");
    EXPECT_TRUE(absl::StartsWith(r.headers.at("authorization"), "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"));
    EXPECT_EQ(r.headers.at("host"), absl::StrCat("127.0.0.1:", server_.port()));
  }
}

TEST_F(S3ClientFault, RetriesAreBounded) {
  server_.Script({SlowDown(), SlowDown(), SlowDown(), SlowDown()});
  auto got = Client(server_.endpoint())->HeadObject("bkt", "k");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(got.status().message(), server_.endpoint())) << got.status();
  EXPECT_EQ(server_.requests().size(), 3u);

  // 4xx the caller must fix are not retried; S3's code and message are kept.
  server_.Script({{HttpReply(403, {}, "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>")}});
  auto put = Client(server_.endpoint())->PutObject("bkt", "k", "x");
  EXPECT_EQ(put.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(put.status().message(), "AccessDenied: Access Denied")) << put.status();
  EXPECT_EQ(server_.requests().size(), 4u);
  server_.Script({{HttpReply(404, {}, "<Error><Code>NoSuchBucket</Code><Message>gone</Message></Error>")}});
  auto list = Client(server_.endpoint())->ListObjects("bkt", "");
  EXPECT_EQ(list.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(list.status().message(), "bucket 'bkt'")) << list.status();
  EXPECT_EQ(server_.requests().size(), 5u);
}

TEST_F(S3ClientFault, RedirectsAreNotFollowed) {
  ScriptedHttpServer elsewhere;
  server_.Script({{HttpReply(301, {{"Location", elsewhere.endpoint() + "/bkt/k"}},
                             "<Error><Code>PermanentRedirect</Code><Message>use another endpoint</Message></Error>")}});
  auto got = Client(server_.endpoint())->GetObjectRange("bkt", "k", 0, 1);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "PermanentRedirect")) << got.status();
  EXPECT_TRUE(elsewhere.requests().empty());
}

TEST_F(S3ClientFault, ContentRangeMustMatch) {
  server_.Script({{HttpReply(206, {{"Content-Range", "bytes 5-9/100"}}, "56789")}});
  auto got = Client(server_.endpoint())->GetObjectRange("bkt", "k", 0, 5);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  // A server that ignores Range and sends the whole object from offset 0.
  server_.Script({{HttpReply(200, {}, std::string(100, 'x'))}});
  got = Client(server_.endpoint())->GetObjectRange("bkt", "k", 10, 5);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  // More bytes than the Content-Range announced.
  server_.Script({{HttpReply(206, {{"Content-Range", "bytes 0-1/100"}}, "0123")}});
  got = Client(server_.endpoint())->GetObjectRange("bkt", "k", 0, 2);
  EXPECT_FALSE(got.ok());
}

TEST_F(S3ClientFault, BrokenDownloadResumesFromTheSameVersion) {
  server_.Script({
      // Announces 10 bytes, sends 5, closes.
      {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nETag: \"v1\"\r\nConnection: close\r\n\r\n01234"},
      {HttpReply(206, {{"Content-Range", "bytes 5-9/10"}, {"ETag", "\"v1\""}}, "56789")},
  });
  std::string out;
  absl::Status st = Client(server_.endpoint())->GetObject("bkt", "k", [&](absl::string_view p) {
    out.append(p.data(), p.size());
    return absl::OkStatus();
  });
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(out, "0123456789");
  auto reqs = server_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[1].headers["range"], "bytes=5-");
  EXPECT_EQ(reqs[1].headers["if-match"], "\"v1\"");

  // The object replaced in between: the precondition fails, nothing is mixed.
  server_.Script({
      {"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nETag: \"v1\"\r\nConnection: close\r\n\r\n01234"},
      {HttpReply(412, {}, "<Error><Code>PreconditionFailed</Code></Error>")},
  });
  st = Client(server_.endpoint())->GetObject("bkt", "k", [](absl::string_view) { return absl::OkStatus(); });
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
}

TEST_F(S3ClientFault, CompleteMultipartErrorInsideA200IsRetried) {
  server_.Script({
      {HttpReply(200, {}, "<Error><Code>InternalError</Code><Message>try again</Message></Error>")},
      {HttpReply(200, {}, "<CompleteMultipartUploadResult><ETag>\"abc-2\"</ETag></CompleteMultipartUploadResult>")},
  });
  auto etag = Client(server_.endpoint())->CompleteMultipartUpload("bkt", "k", "up&id", {{1, "e1"}, {2, "e2"}});
  ASSERT_TRUE(etag.ok()) << etag.status();
  EXPECT_EQ(*etag, "abc-2");
  auto reqs = server_.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].target, "/bkt/k?uploadId=up%26id");
  EXPECT_EQ(reqs[0].body,
            "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>&quot;e1&quot;</ETag></Part>"
            "<Part><PartNumber>2</PartNumber><ETag>&quot;e2&quot;</ETag></Part></CompleteMultipartUpload>");
  EXPECT_EQ(reqs[0].headers["x-amz-content-sha256"], Sha256Hex(reqs[0].body));
}

TEST_F(S3ClientFault, HungEndpointTimesOut) {
  S3ClientOptions o = testing::FastClientOptions(server_.endpoint(), {"AKIDEXAMPLE", "secret", ""});
  o.retry.max_attempts = 2;
  o.low_speed_time = absl::Seconds(1);
  auto c = S3Client::Create(o);
  ASSERT_TRUE(c.ok());
  server_.Script({{"", true}, {"", true}});
  const absl::Time start = absl::Now();
  auto got = (*c)->GetObjectRange("bkt", "k", 0, 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), server_.endpoint())) << got.status();
}

TEST_F(S3ClientFault, RefusedConnectionIsUnavailableAfterRetries) {
  const std::string endpoint = absl::StrCat("http://127.0.0.1:", testing::UnusedPort());
  const absl::Time start = absl::Now();
  auto got = Client(endpoint, 4)->PutObject("bkt", "k", "data");
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), endpoint)) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "4 attempts")) << got.status();
}

TEST_F(S3ClientFault, VirtualHostAddressing) {
  // "localhost": libcurl resolves every *.localhost name to loopback (RFC 6761), so
  // bkt.localhost reaches this server without DNS.
  S3ClientOptions o =
      testing::FastClientOptions(absl::StrCat("http://localhost:", server_.port()), {"AKIDEXAMPLE", "secret", "tok"});
  o.config.addressing = Addressing::kVirtualHost;
  auto c = S3Client::Create(o);
  ASSERT_TRUE(c.ok());
  // curl connects to the endpoint; the bucket goes into the Host header (and the signature).
  server_.Script({{HttpReply(200, {{"Content-Length", "7"}, {"ETag", "\"e\""}}, "")}});
  auto meta = (*c)->HeadObject("bkt", "dir/k");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->etag, "e");
  EXPECT_EQ(meta->size, 7);
  auto reqs = server_.requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].method, "HEAD");
  EXPECT_EQ(reqs[0].target, "/dir/k");
  EXPECT_EQ(reqs[0].headers["host"], absl::StrCat("bkt.localhost:", server_.port()));
  EXPECT_EQ(reqs[0].headers["x-amz-security-token"], "tok");
}

TEST(S3ClientStatus, Mapping) {
  EXPECT_EQ(StatusFromHttp(404, {"NoSuchKey"}, "GetObject", "b", "k").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(StatusFromHttp(403, {}, "GetObject", "b", "k").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(StatusFromHttp(416, {}, "GetObject", "b", "k").code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(StatusFromHttp(409, {"BucketNotEmpty"}, "x", "b", "").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(StatusFromHttp(400, {"EntityTooSmall"}, "x", "b", "k").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StatusFromHttp(501, {}, "x", "b", "k").code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(StatusFromHttp(429, {}, "x", "b", "k").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StatusFromHttp(307, {}, "x", "b", "k").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(StatusFromHttp(404, {"NoSuchBucket", "gone"}, "x", "b", "k").message(), "bucket 'b'"));
  // A missing bucket is told from a missing key without reading the message.
  EXPECT_TRUE(IsNoSuchBucket(StatusFromHttp(404, {"NoSuchBucket", "gone"}, "x", "b", "k")));
  EXPECT_FALSE(IsNoSuchBucket(StatusFromHttp(404, {"NoSuchKey"}, "GetObject", "b", "k")));
  EXPECT_FALSE(IsNoSuchBucket(StatusFromHttp(404, {}, "HeadObject", "b", "k")));
  const absl::Status upload = StatusFromHttp(404, {"NoSuchUpload", "gone"}, "UploadPart", "b", "k");
  EXPECT_EQ(upload.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(upload.message(), "multipart upload of s3://b/k")) << upload;
}

}  // namespace
}  // namespace recal::s3
