#include "server/api/listen_security.h"

#include <unistd.h>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace recal::api {

bool IsLoopbackAddress(const std::string& address) {
  absl::string_view host = address;
  if (absl::StartsWith(host, "unix:") || absl::StartsWith(host, "unix-abstract:")) return true;
  if (absl::ConsumePrefix(&host, "[")) {
    host = host.substr(0, host.find(']'));
    return host == "::1";
  }
  host = host.substr(0, host.rfind(':'));
  return host == "localhost" || absl::StartsWith(host, "127.");
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(const TlsFiles& tls) {
  if (tls.cert.empty() && tls.key.empty()) {
    if (!tls.client_ca.empty()) return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert.empty() || tls.key.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls_cert and --tls_key");
  }
  for (const std::string* file : {&tls.cert, &tls.key, &tls.client_ca}) {
    if (!file->empty() && ::access(file->c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("cannot read ", *file));
    }
  }
  // The provider re-reads the files every reload_seconds: renewed certificates apply to
  // new connections without a restart.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key, tls.cert, tls.client_ca, tls.reload_seconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!tls.client_ca.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace recal::api
