// The HTTP layer under the S3 client, against a scripted server: what counts as a response,
// what is refused, and which failures another attempt may get past.
#include "server/s3/http_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "tests/s3/test_http_server.h"

namespace recal::s3 {
namespace {

using ::testing::HasSubstr;
using testing::HttpReply;
using testing::ScriptedHttpServer;

HttpRequest Get(const std::string& url) {
  HttpRequest r;
  r.what = "GetObject s3://b/k";
  r.peer = "S3 endpoint test";
  r.url = url;
  return r;
}

TEST(HttpTransport, AnyStatusIsAResponseAndARedirectIsNeverFollowed) {
  ScriptedHttpServer server;
  server.Script({{HttpReply(302, {{"Location", server.endpoint() + "/elsewhere"}}, "")}});
  HttpTransport transport(HttpTimeouts{});
  bool retryable = true;
  auto response = transport.Perform(Get(server.endpoint() + "/b/k"), &retryable);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->http, 302);
  EXPECT_FALSE(retryable);
  ASSERT_EQ(server.requests().size(), 1u);
  EXPECT_EQ(server.requests()[0].target, "/b/k");
}

TEST(HttpTransport, ABufferedBodyOverItsLimitIsRefusedNamingTheExchange) {
  ScriptedHttpServer server;
  server.Script({{HttpReply(200, {}, std::string(5000, 'x'))}});
  HttpTransport transport(HttpTimeouts{});
  HttpRequest request = Get(server.endpoint() + "/b/k");
  request.max_body = 1000;
  bool retryable = true;
  auto response = transport.Perform(request, &retryable);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(response.status().message(), HasSubstr("GetObject s3://b/k: a response over 1000 bytes"));
  EXPECT_FALSE(retryable);
}

TEST(HttpTransport, AnErrorBodyKeepsOnlyItsBeginning) {
  ScriptedHttpServer server;
  server.Script({{HttpReply(500, {}, std::string(200 << 10, 'e'))}});
  HttpTransport transport(HttpTimeouts{});
  bool retryable = false;
  auto response = transport.Perform(Get(server.endpoint() + "/b/k"), &retryable);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->http, 500);
  EXPECT_LE(response->body.size(), size_t{64} << 10);
  EXPECT_GE(response->body.size(), size_t{32} << 10);
  EXPECT_EQ(response->body, std::string(response->body.size(), 'e'));
}

TEST(HttpTransport, ARefusedConnectionMayBeRetriedAndNamesTheExchangeAndThePeer) {
  HttpTransport transport(HttpTimeouts{});
  bool retryable = false;
  auto response = transport.Perform(Get(absl::StrCat("http://127.0.0.1:", testing::UnusedPort(), "/b/k")), &retryable);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(response.status().message(), HasSubstr("GetObject s3://b/k: S3 endpoint test: "));
  EXPECT_TRUE(retryable);
}

TEST(HttpTransport, ASinkThatFailsEndsTheExchangeWithItsOwnStatus) {
  ScriptedHttpServer server;
  server.Script({{HttpReply(200, {}, "some bytes")}});
  HttpTransport transport(HttpTimeouts{});
  HttpRequest request = Get(server.endpoint() + "/b/k");
  request.sink = [](absl::string_view) { return absl::DataLossError("the sink says no"); };
  bool retryable = true;
  auto response = transport.Perform(request, &retryable);
  EXPECT_EQ(response.status(), absl::DataLossError("the sink says no"));
  EXPECT_FALSE(retryable);
}

TEST(HttpTransport, APutSendsItsBodyAndHeaderLinesAsGiven) {
  ScriptedHttpServer server;
  server.Script({{HttpReply(200, {{"ETag", "\"e\""}}, "")}});
  HttpTransport transport(HttpTimeouts{});
  const Body body = BodyFromBytes("hello, bucket");
  HttpRequest request = Get(server.endpoint() + "/b/k");
  request.method = "PUT";
  request.body = &body;
  request.header_lines = {"X-Test: one", "Expect:"};
  bool retryable = true;
  auto response = transport.Perform(request, &retryable);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->headers["etag"], "\"e\"");
  ASSERT_EQ(server.requests().size(), 1u);
  EXPECT_EQ(server.requests()[0].method, "PUT");
  EXPECT_EQ(server.requests()[0].body, "hello, bucket");
  EXPECT_EQ(server.requests()[0].headers["x-test"], "one");
  EXPECT_EQ(server.requests()[0].headers.count("expect"), 0u);
}

}  // namespace
}  // namespace recal::s3
