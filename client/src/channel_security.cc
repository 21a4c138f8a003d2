#include "client/src/channel_security.h"

#include <openssl/crypto.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace recal::client_internal {
namespace {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", what, " '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// One PEM input given inline or as a file. `name` is the option's name, as the caller wrote
// it, for the messages.
absl::StatusOr<std::string> Pem(const std::string& inline_pem, const std::string& file, const std::string& name,
                                const std::string& what) {
  if (!inline_pem.empty() && !file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("give ", name, " or ", name, "_file, not both"));
  }
  std::string pem = inline_pem;
  std::string source = name;
  if (!file.empty()) {
    auto read = ReadPemFile(file, what);
    if (!read.ok()) return read.status();
    pem = *std::move(read);
    source = absl::StrCat("'", file, "'");
  }
  // gRPC would only fail the handshake, as UNAVAILABLE at every call, with no word of why.
  if ((!file.empty() || !pem.empty()) && !absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", source, " holds no PEM data"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const ClientOptions& options,
                                                                                 grpc::ChannelArguments* args) {
  // The roots file wins over inline roots, as it always has.
  auto roots = options.tls_root_certs_file.empty()
                   ? Pem(options.tls_root_certs, "", "tls_root_certs", "TLS root certificates")
                   : Pem("", options.tls_root_certs_file, "tls_root_certs", "TLS root certificates");
  if (!roots.ok()) return roots.status();
  auto cert = Pem(options.tls_client_cert, options.tls_client_cert_file, "tls_client_cert", "TLS client certificate");
  if (!cert.ok()) return cert.status();
  auto key = Pem(options.tls_client_key, options.tls_client_key_file, "tls_client_key", "TLS client key");
  if (!key.ok()) return key.status();
  if (!cert->empty() && key->empty()) {
    return absl::InvalidArgumentError(
        "a TLS client certificate needs its private key (tls_client_key or tls_client_key_file)");
  }
  if (cert->empty() && !key->empty()) {
    return absl::InvalidArgumentError(
        "a TLS client key needs its certificate (tls_client_cert or tls_client_cert_file)");
  }

  // Anything TLS-specific asks for TLS: a plaintext channel would silently drop it.
  const bool tls = options.tls || !roots->empty() || !cert->empty() || !options.tls_server_name.empty();
  if (!tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = *std::move(roots);  // empty: gRPC's default roots
  ssl.pem_cert_chain = *std::move(cert);
  ssl.pem_private_key = *std::move(key);
  if (!options.tls_server_name.empty()) {
    args->SetString(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, options.tls_server_name);
  }
  // gRPC may still be reconnecting on its own threads when the program exits, and OpenSSL's
  // atexit cleanup would free what those threads use (seen under ASan: recalctl, refused at
  // the handshake, died of SIGSEGV in RAND while exiting, instead of exit code 3). Asked
  // before gRPC first initialises OpenSSL; where the program has done so itself, it decides.
  OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr);
  return grpc::SslCredentials(ssl);
}

}  // namespace recal::client_internal
