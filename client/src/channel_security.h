// How Connect secures its channel: plaintext, TLS, or mutual TLS, as ClientOptions asks.
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>

#include "absl/status/statusor.h"
#include "recal/client.h"

namespace recal::client_internal {

// The channel's credentials; sets the server-name override on `args` when one is asked
// for. Reads the certificate and key files now, so that a bad file is reported by Connect
// (naming it) rather than as an UNAVAILABLE at the first call.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(const ClientOptions& options,
                                                                                 grpc::ChannelArguments* args);

}  // namespace recal::client_internal
