#include "server/relay/internal_endpoint.h"

#include <unistd.h>

#include <grpcpp/server_builder.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace recal::relay {
namespace {

// "host:port" or "[v6]:port" split at the port; no port: the whole string is the host.
std::pair<std::string, std::string> SplitHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  const size_t bracket = address.rfind(']');
  if (colon == std::string::npos || (bracket != std::string::npos && colon < bracket)) return {address, ""};
  return {address.substr(0, colon), address.substr(colon + 1)};
}

}  // namespace

absl::StatusOr<InternalEndpoint> ServeInternal(const std::string& listen, const std::string& advertise,
                                               const std::shared_ptr<grpc::ServerCredentials>& credentials,
                                               const std::vector<grpc::Service*>& services, int max_message_bytes) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, credentials, &port);
  builder.SetMaxReceiveMessageSize(max_message_bytes);
  for (grpc::Service* service : services) builder.RegisterService(service);
  // The relays' keepalive pings (every 30 s while a stream waits on a full feed) are welcome.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  InternalEndpoint endpoint;
  endpoint.server = builder.BuildAndStart();
  if (!endpoint.server || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, " (--internal_listen)"));
  }
  auto [host, advertised_port] = SplitHostPort(advertise);
  if (host.empty()) {
    host = SplitHostPort(listen).first;
    if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
      char name[256] = {};
      if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') {
        return absl::FailedPreconditionError(
            "this host has no name to advertise the internal endpoint by: give --advertise_address");
      }
      host = name;
    }
  }
  int parsed = 0;
  if (!advertised_port.empty() && (!absl::SimpleAtoi(advertised_port, &parsed) || parsed <= 0 || parsed > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat("--advertise_address=", advertise, " has no valid port"));
  }
  endpoint.advertised = absl::StrCat(host, ":", advertised_port.empty() ? absl::StrCat(port) : advertised_port);
  return endpoint;
}

}  // namespace recal::relay
