// recal::Client over TLS and mutual TLS against an in-process gRPC server that insists on a
// client certificate from its CA (certificates from tests/certs/make_test_certs.sh), and
// Connect's checks of the TLS options.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "recal/client.h"
#include "recal/v1/recal.grpc.pb.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// ListJobs answers an empty page and records who called (the client certificate's common
// name) with which token.
class RecordingRecal final : public v1::Recal::Service {
 public:
  struct Call {
    std::string common_name;
    std::string authorization;
  };

  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest*,
                        v1::ListJobsResponse*) override {
    Call call;
    const auto names = context->auth_context()->FindPropertyValues("x509_common_name");
    if (!names.empty()) call.common_name.assign(names[0].data(), names[0].size());
    const auto token = context->client_metadata().find("authorization");
    if (token != context->client_metadata().end()) call.authorization.assign(token->second.data(), token->second.size());
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(call);
    return grpc::Status::OK;
  }

  std::vector<std::string> CommonNames() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> names;
    for (const Call& call : calls_) names.push_back(call.common_name);
    return names;
  }

  std::vector<std::string> Tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> tokens;
    for (const Call& call : calls_) tokens.push_back(call.authorization);
    return tokens;
  }

 private:
  std::mutex mu_;
  std::vector<Call> calls_;
};

// One set of certificates per test suite: making them takes ~0.1 s.
class CertsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new TempDir();
    const std::string command = absl::StrCat(RECAL_MAKE_TEST_CERTS, " ", certs_->path());
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }

  static std::string Cert(const std::string& name) { return certs_->File(name); }

  // mTLS with the files of identity `name` (client, expired, stranger) and the test CA.
  static ClientOptions Identity(const std::string& name) {
    ClientOptions options;
    options.tls_root_certs_file = Cert("ca.pem");
    options.tls_client_cert_file = Cert(name + ".pem");
    options.tls_client_key_file = Cert(name + ".key");
    return options;
  }

  static TempDir* certs_;
};

TempDir* CertsTest::certs_ = nullptr;

class TlsClientTest : public CertsTest {
 protected:
  void SetUp() override {
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = ReadBytes(Cert("ca.pem"));
    ssl.pem_key_cert_pairs.push_back({ReadBytes(Cert("server.key")), ReadBytes(Cert("server.pem"))});
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override { server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1))); }

  // The status of one List through a client with `options` (and quick retries: a refused
  // handshake is UNAVAILABLE, which is retried).
  absl::Status ListWith(ClientOptions options, const std::string& target = "") {
    options.retry.max_attempts = 2;
    options.retry.initial_backoff = absl::Milliseconds(10);
    options.retry.max_backoff = absl::Milliseconds(50);
    options.deadline = absl::Seconds(5);
    auto client = Client::Connect(target.empty() ? address_ : target, options);
    if (!client.ok()) return client.status();
    return (*client)->List().status();
  }

  RecordingRecal service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(TlsClientTest, MutualTlsFromFilesCarriesTheIdentityAndTheToken) {
  ClientOptions options = Identity("client");
  options.bearer_token = "recal_secret";
  EXPECT_TRUE(ListWith(options).ok());
  EXPECT_THAT(service_.CommonNames(), ElementsAre("trainer-a"));
  EXPECT_THAT(service_.Tokens(), ElementsAre("Bearer recal_secret"));
}

TEST_F(TlsClientTest, MutualTlsFromInlinePem) {
  ClientOptions options;
  options.tls_root_certs = ReadBytes(Cert("ca.pem"));
  options.tls_client_cert = ReadBytes(Cert("client.pem"));
  options.tls_client_key = ReadBytes(Cert("client.key"));
  EXPECT_TRUE(ListWith(options).ok());
  EXPECT_THAT(service_.CommonNames(), ElementsAre("trainer-a"));
}

TEST_F(TlsClientTest, WithoutAValidClientCertificateNothingGetsThrough) {
  ClientOptions roots_only;
  roots_only.tls_root_certs_file = Cert("ca.pem");
  ClientOptions untrusted_server = Identity("client");
  untrusted_server.tls_root_certs_file = Cert("other_ca.pem");
  const std::vector<std::pair<std::string, ClientOptions>> cases = {
      {"plaintext", ClientOptions{}},
      {"no client certificate", roots_only},
      {"another CA's certificate", Identity("stranger")},
      {"an expired certificate", Identity("expired")},
      {"roots that do not vouch for the server", untrusted_server},
  };
  for (const auto& [what, options] : cases) {
    EXPECT_EQ(ListWith(options).code(), absl::StatusCode::kUnavailable) << what;
  }
  EXPECT_THAT(service_.CommonNames(), IsEmpty());
}

TEST_F(TlsClientTest, TheServerNameOverrideIsTheNameChecked) {
  // The target is an IP address (in the certificate too); the override replaces it.
  ClientOptions options = Identity("client");
  options.tls_server_name = "localhost";
  EXPECT_TRUE(ListWith(options).ok());
  options.tls_server_name = "wrong.example";
  EXPECT_EQ(ListWith(options).code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(service_.CommonNames(), ElementsAre("trainer-a"));
}

class TlsOptionsTest : public CertsTest {};

TEST_F(TlsOptionsTest, ACertificateAndItsKeyComeTogether) {
  ClientOptions options;
  options.tls_client_cert_file = Cert("client.pem");
  auto status = Client::Connect("localhost:1", options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("needs its private key (tls_client_key or tls_client_key_file)"));

  options = {};
  options.tls_client_key = ReadBytes(Cert("client.key"));
  status = Client::Connect("localhost:1", options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("needs its certificate (tls_client_cert or tls_client_cert_file)"));

  options = Identity("client");
  options.tls_client_cert = ReadBytes(Cert("client.pem"));
  status = Client::Connect("localhost:1", options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tls_client_cert or tls_client_cert_file, not both"));

  EXPECT_TRUE(Client::Connect("localhost:1", Identity("client")).ok());
  options = {};
  options.tls_client_cert_file = Cert("client.pem");
  options.tls_client_key_file = Cert("client.key");  // no roots: the system's
  EXPECT_TRUE(Client::Connect("localhost:1", options).ok());
}

TEST_F(TlsOptionsTest, AnUnreadableFileIsNamed) {
  const std::string missing = Cert("missing.pem");
  for (const std::string which : {"roots", "cert", "key"}) {
    ClientOptions options = Identity("client");
    if (which == "roots") options.tls_root_certs_file = missing;
    if (which == "cert") options.tls_client_cert_file = missing;
    if (which == "key") options.tls_client_key_file = missing;
    const absl::Status status = Client::Connect("localhost:1", options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << which;
    EXPECT_THAT(status.message(), HasSubstr("'" + missing + "'")) << which;
  }
}

TEST_F(TlsOptionsTest, WhatIsNotPemIsRefusedByConnect) {
  const std::string text = Cert("text.pem");
  WriteBytes(text, "not a certificate\n");
  ClientOptions options = Identity("client");
  options.tls_client_key_file = text;
  absl::Status status = Client::Connect("localhost:1", options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("TLS client key '" + text + "' holds no PEM data"));

  options = {};
  options.tls_root_certs = "not a certificate";
  status = Client::Connect("localhost:1", options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("tls_root_certs holds no PEM data"));
}

}  // namespace
}  // namespace recal::testing
