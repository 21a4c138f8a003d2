#include "server/app/access.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/api/listen_security.h"
#include "server/log/log.h"
#include "server/store/metadata_store.h"

namespace recal::app {

absl::StatusOr<std::optional<relay::RelaySecret>> ClusterSecretFor(const ServerOptions& options) {
  if (options.role != Role::kAll && !options.internal_token_file.empty()) {
    RECAL_ASSIGN_OR_RETURN(relay::RelaySecret secret, relay::RelaySecret::FromFile(options.internal_token_file));
    return std::optional<relay::RelaySecret>(std::move(secret));
  }
  if (options.role == Role::kApi) {
    return absl::FailedPreconditionError(
        "--role=api starts no recal-worker, so the worker processes inspect its uploads, reached with the "
        "cluster secret: give --internal_token_file=FILE, the same file as the workers' (at least 32 characters, "
        "e.g. a token from 'recalctl token new')");
  }
  return std::optional<relay::RelaySecret>();
}

absl::StatusOr<std::unique_ptr<auth::Authenticator>> AuthenticatorFor(const ServerOptions& options) {
  if (!options.auth_file.empty()) return auth::Authenticator::FromFile(options.auth_file);
  const bool loopback = api::IsLoopbackAddress(options.listen);
  if (!loopback && !options.allow_unauthenticated) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to serve ", options.listen, " without credentials: anyone who reaches it could read every model "
        "and result. Give --auth_file=FILE (make a token with 'recalctl token new --tenant T --role submit'), "
        "listen on loopback (--listen=127.0.0.1:50051), or pass --allow_unauthenticated if the network is yours"));
  }
  if (!loopback) {
    log::Warning(absl::StrCat("recal-server: serving ", options.listen,
                              " WITHOUT authentication (--allow_unauthenticated): every caller is admin"));
  }
  return auth::Authenticator::Open(store::kDefaultTenant);
}

}  // namespace recal::app
