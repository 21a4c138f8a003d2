// How the server listens: plaintext only on loopback unless told otherwise, TLS from PEM
// files that are re-read when they change, client certificates required when a CA is given.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/server_credentials.h>

#include "absl/status/statusor.h"

namespace recal::api {

struct TlsFiles {
  std::string cert;       // PEM certificate chain; empty: no TLS
  std::string key;        // PEM private key
  std::string client_ca;  // PEM roots; set: every client must present a certificate they signed
  unsigned reload_seconds = 5;
};

// Whether `address` ("host:port", "[v6]:port", "unix:...") can be reached from this host only.
bool IsLoopbackAddress(const std::string& address);

// The credentials to listen with; INVALID_ARGUMENT for a key without a certificate (or the
// reverse) and for files that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(const TlsFiles& tls);

}  // namespace recal::api
