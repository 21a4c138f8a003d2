// What the public Client hides: the channel, the stubs, and how every call is made
// (metadata, deadline, retries). Shared by the client's .cc files only.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/src/backoff.h"
#include "common/grpc_status.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "recal/client.h"
#include "recal/v1/recal.grpc.pb.h"

namespace recal {
namespace client_internal {

// The error for a job that ended FAILED or CANCELLED: the job's code and message, with the
// job attached (JobOfError reads it back).
absl::Status JobError(const v1::Job& job);

// UNAVAILABLE for a target where no server answered (IsUnreachable reads the mark back).
absl::Status UnreachableError(const std::string& target, absl::string_view detail);

}  // namespace client_internal

struct Client::Impl {
  std::string target;
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Recal::Stub> stub;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;

  // The bearer token on every call; the deadline on unary ones (streams last as long as
  // the transfer or the job does).
  void Prepare(grpc::ClientContext* context, bool unary) const {
    if (!options.bearer_token.empty()) {
      context->AddMetadata("authorization", "Bearer " + options.bearer_token);
    }
    if (unary) context->set_deadline(absl::ToChronoTime(absl::Now() + options.deadline));
  }

  // A status for the caller: UNAVAILABLE says which server could not be reached, other
  // codes keep the server's own message.
  absl::Status Explain(const absl::Status& status) const {
    if (status.code() != absl::StatusCode::kUnavailable) return status;
    // Not connected now: nothing answered at the target (a server that answered and then
    // went away is reconnected to, and so not READY either, but only after the retries).
    if (channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
      return client_internal::UnreachableError(target, status.message());
    }
    return absl::UnavailableError(
        absl::StrCat("recal-server at ", target, " is unavailable: ", status.message()));
  }

  // `rpc(context, response)` until it succeeds, fails with a code other than UNAVAILABLE,
  // or options.retry.max_attempts are spent (one attempt when `retry` is false).
  template <typename Response, typename Rpc>
  absl::StatusOr<Response> Unary(Rpc rpc, bool retry = true) const {
    client_internal::Backoff backoff(options.retry);
    const int attempts = retry ? std::max(1, options.retry.max_attempts) : 1;
    absl::Status status;
    for (int attempt = 1;; ++attempt) {
      grpc::ClientContext context;
      Prepare(&context, /*unary=*/true);
      Response response;
      status = FromGrpcStatus(rpc(&context, &response));
      if (status.ok()) return response;
      if (!client_internal::IsRetryable(status) || attempt >= attempts) break;
      absl::SleepFor(backoff.Next());
    }
    return Explain(status);
  }
};

}  // namespace recal
