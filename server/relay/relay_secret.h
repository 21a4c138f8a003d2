// The shared secret that admits one process of a cluster to another's internal endpoint
// (--internal_token_file: a file every api replica and worker process mounts). Calls carry it
// in a header of their own, never the client's `authorization`; it is compared by digest in
// constant time and never logged.
#pragma once

#include <string>

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include "absl/status/statusor.h"

namespace recal::relay {

class RelaySecret {
 public:
  // The file's first line, trimmed; INVALID_ARGUMENT if it cannot be read or holds fewer than
  // 32 characters (`recalctl token new` makes a fitting one).
  static absl::StatusOr<RelaySecret> FromFile(const std::string& path);

  // Whether the call presents the secret.
  bool Admits(const grpc::ServerContext& context) const;
  // Makes the call present it.
  void AttachTo(grpc::ClientContext& context) const;

 private:
  RelaySecret(std::string secret, std::string digest) : secret_(std::move(secret)), digest_(std::move(digest)) {}
  std::string secret_;
  std::string digest_;  // SHA-256 hex of secret_
};

}  // namespace recal::relay
