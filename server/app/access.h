// Who may reach a recal-server process, decided before anything listens: the callers (the
// auth file, or the open mode on loopback) and, in cluster mode, the other processes (the
// shared secret of --internal_token_file).
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "server/app/server_options.h"
#include "server/auth/authenticator.h"
#include "server/relay/relay_secret.h"

namespace recal::app {

// Role all: none. Roles api and worker: the secret read from internal_token_file, if given;
// role api requires it (FAILED_PRECONDITION saying why), since the worker processes inspect
// its uploads. The file's own error (INVALID_ARGUMENT) when it cannot be used.
absl::StatusOr<std::optional<relay::RelaySecret>> ClusterSecretFor(const ServerOptions& options);

// The auth file's authenticator; without one, every caller is admin of the default tenant,
// which is refused (FAILED_PRECONDITION) beyond loopback unless allow_unauthenticated.
absl::StatusOr<std::unique_ptr<auth::Authenticator>> AuthenticatorFor(const ServerOptions& options);

}  // namespace recal::app
