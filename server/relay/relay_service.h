// A worker process's side of the relay: the internal endpoint (--internal_listen) that takes
// the pushed batches an api replica relays, into the feed of the job this process runs. Only
// callers that present the cluster secret are served (UNAUTHENTICATED otherwise, logged with
// the peer). The next message is read only once the feed has taken the last: its bounded
// buffer is what holds the client back.
#pragma once

#include <atomic>

#include "recal/internal/v1/relay.grpc.pb.h"
#include "server/jobs/job_manager.h"
#include "server/log/repeat_limiter.h"
#include "server/relay/relay_secret.h"

namespace recal::relay {

class RelayService final : public internal::v1::BatchRelay::Service {
 public:
  explicit RelayService(RelaySecret secret) : secret_(std::move(secret)) {}

  // The jobs whose feeds are served; set before the process claims any job (no relay is sent
  // here before one of its claims records this endpoint). Calls before it: UNAVAILABLE.
  void Bind(jobs::JobManager* jobs) { jobs_ = jobs; }

  grpc::Status PushBatches(grpc::ServerContext* context, grpc::ServerReader<v1::PushBatchesRequest>* reader,
                           v1::PushBatchesResponse* response) override;

 private:
  const RelaySecret secret_;
  std::atomic<jobs::JobManager*> jobs_{nullptr};
  // Refused callers' lines: the first few per peer a minute (server/log/repeat_limiter.h).
  log::RepeatLimiter refused_log_{5, absl::Minutes(1)};
};

}  // namespace recal::relay
