#include "server/relay/relay_client.h"

#include <fstream>
#include <sstream>

#include <grpcpp/create_channel.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "recal/internal/v1/relay.grpc.pb.h"

namespace recal::relay {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return bytes.str();
}

}  // namespace

// One client stream relayed to one worker process.
class RelayedPush final : public jobs::PushStream {
 public:
  RelayedPush(RelayClient* client, const std::shared_ptr<grpc::Channel>& channel, std::string address,
              std::string feed_id)
      : client_(client),
        stub_(internal::v1::BatchRelay::NewStub(channel)),
        address_(std::move(address)),
        feed_id_(std::move(feed_id)) {
    client_->secret_.AttachTo(context_);
    client_->Track(&context_);
    writer_ = stub_->PushBatches(&context_, &response_);
  }
  ~RelayedPush() override {
    if (!finished_) context_.TryCancel();  // the client went away: the worker's handler ends
    client_->Untrack(&context_);
  }

  absl::Status Push(v1::PushBatchesRequest& message) override {
    if (finished_) return status_;
    message.set_job_id(feed_id_);  // the worker knows the job it runs, not the client's shard number
    message.set_shard(0);
    // Blocks while the worker's feed (and the flow-control windows before it) are full.
    if (!writer_->Write(message)) return Finish();
    ++written_;
    return absl::OkStatus();
  }

  absl::Status Finish() override {
    if (finished_) return status_;
    finished_ = true;
    writer_->WritesDone();
    status_ = Explain(FromGrpcStatus(writer_->Finish()));
    return status_;
  }

 private:
  // The worker's own refusals pass as they are; a broken connection is said in the job's
  // terms. Before anything went through, the client may simply push again; after, the batches
  // already in the lost run are gone with it.
  absl::Status Explain(const absl::Status& status) const {
    if (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status)) return status;
    if (written_ == 0) {
      return absl::UnavailableError(absl::StrCat("cannot reach the worker process running job ", feed_id_, " at ",
                                                 address_, " (", status.message(), "); push again"));
    }
    return absl::AbortedError(absl::StrCat(
        "the worker process running job ", feed_id_, " (", address_, ") went away mid-stream (", status.message(),
        "); the batches pushed to it are not kept, so the job cannot complete (it fails once its lease runs out; "
        "cancel it if its worker lives on, cut off from this replica): submit it again and push from the first "
        "batch"));
  }

  RelayClient* const client_;
  std::unique_ptr<internal::v1::BatchRelay::Stub> stub_;
  const std::string address_;
  const std::string feed_id_;
  grpc::ClientContext context_;
  v1::PushBatchesResponse response_;
  std::unique_ptr<grpc::ClientWriter<v1::PushBatchesRequest>> writer_;
  int64_t written_ = 0;
  bool finished_ = false;
  absl::Status status_;
};

absl::StatusOr<std::unique_ptr<RelayClient>> RelayClient::Make(RelaySecret secret,
                                                                const RelayClientOptions& options) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options.tls_ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    auto roots = ReadPem(options.tls_ca);
    if (!roots.ok()) return roots.status();
    ssl.pem_root_certs = *std::move(roots);
    if (!options.tls_cert.empty() && !options.tls_key.empty()) {
      auto cert = ReadPem(options.tls_cert);
      if (!cert.ok()) return cert.status();
      auto key = ReadPem(options.tls_key);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    credentials = grpc::SslCredentials(ssl);
  }
  return std::unique_ptr<RelayClient>(new RelayClient(std::move(secret), std::move(credentials),
                                                      options.max_message_bytes));
}

std::shared_ptr<grpc::Channel> RelayClient::ChannelTo(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (!channel) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(max_message_bytes_);
    // A worker host that vanishes without closing its connections (a cut network) is noticed
    // within ~40 s instead of leaving a blocked relay waiting forever.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
    channel = grpc::CreateCustomChannel(address, credentials_, args);
  }
  return channel;
}

absl::StatusOr<std::unique_ptr<jobs::PushStream>> RelayClient::Open(const std::string& address,
                                                                    const std::string& feed_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return absl::UnavailableError("the server is shutting down; push again");
  }
  return std::unique_ptr<jobs::PushStream>(new RelayedPush(this, ChannelTo(address), address, feed_id));
}

void RelayClient::Track(grpc::ClientContext* call) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.insert(call);
  if (closed_) call->TryCancel();  // opened while CloseAll ran
}

void RelayClient::Untrack(grpc::ClientContext* call) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(call);
}

void RelayClient::CloseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  for (grpc::ClientContext* call : calls_) call->TryCancel();
}

}  // namespace recal::relay
