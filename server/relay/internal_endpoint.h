// A worker process's internal endpoint: its own gRPC server (never the client-facing one, so
// that clients cannot reach it through the API port and the API's auth never sees the
// cluster secret), and the address other processes of the cluster reach it at.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include "absl/status/statusor.h"

namespace recal::relay {

struct InternalEndpoint {
  std::unique_ptr<grpc::Server> server;
  std::string advertised;  // host:port, as recorded in the store
};

// Serves `services` on `listen` ("host:port"; port 0: any free one). The advertised address is
// `advertise` ("HOST:PORT", or "HOST" with the port listened on); empty: the host listened on,
// or this machine's host name when that is a wildcard (0.0.0.0, [::]).
absl::StatusOr<InternalEndpoint> ServeInternal(const std::string& listen, const std::string& advertise,
                                               const std::shared_ptr<grpc::ServerCredentials>& credentials,
                                               const std::vector<grpc::Service*>& services, int max_message_bytes);

}  // namespace recal::relay
