// An api replica's side of the relay (jobs::PushRelay): a client's pushed batches go on, as
// they come, to the internal endpoint of the worker process that runs the job, over one
// channel per worker address, presenting the cluster secret (and TLS when configured; the
// same channels carry the inspections of uploads, remote_inspector.h). The
// client's stream is read only as fast as the worker's bounded feed takes it: each Write
// waits on gRPC flow control, so back-pressure holds from the worker back to the client.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/status/statusor.h"
#include "server/jobs/push_stream.h"
#include "server/relay/relay_secret.h"

namespace recal::relay {

struct RelayClientOptions {
  // PEM roots that sign the workers' internal certificates: relay over TLS. Empty: plaintext
  // (the secret still authenticates; keep such traffic on a network that is yours).
  std::string tls_ca;
  // Presented to workers that ask for a client certificate (their --tls_client_ca).
  std::string tls_cert, tls_key;
  int max_message_bytes = 8 << 20;
};

class RelayClient final : public jobs::PushRelay {
 public:
  // INVALID_ARGUMENT for TLS files that cannot be read.
  static absl::StatusOr<std::unique_ptr<RelayClient>> Make(RelaySecret secret, const RelayClientOptions& options);

  absl::StatusOr<std::unique_ptr<jobs::PushStream>> Open(const std::string& address,
                                                         const std::string& feed_id) override;
  void CloseAll() override;

  // The channel to the worker process at `address` (one per address, kept), and what makes a
  // call on it present the cluster secret.
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);
  void Authorize(grpc::ClientContext& call) const { secret_.AttachTo(call); }
  int max_message_bytes() const { return max_message_bytes_; }

 private:
  friend class RelayedPush;
  friend class RemoteInspector;
  // The calls of the open streams and inspections, to cancel at CloseAll.
  void Track(grpc::ClientContext* call);
  void Untrack(grpc::ClientContext* call);

  RelayClient(RelaySecret secret, std::shared_ptr<grpc::ChannelCredentials> credentials, int max_message_bytes)
      : secret_(std::move(secret)), credentials_(std::move(credentials)), max_message_bytes_(max_message_bytes) {}

  const RelaySecret secret_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const int max_message_bytes_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;  // by worker address
  std::set<grpc::ClientContext*> calls_;
  bool closed_ = false;
};

}  // namespace recal::relay
