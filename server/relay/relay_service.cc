#include "server/relay/relay_service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "server/jobs/batch_assembler.h"
#include "server/log/log.h"

namespace recal::relay {
namespace {

// How long a relayed stream waits for this process's claim of its job to open the feed: the
// claim records the endpoint a moment before it opens the feed.
constexpr absl::Duration kFeedWait = absl::Seconds(10);

}  // namespace

grpc::Status RelayService::PushBatches(grpc::ServerContext* context,
                                       grpc::ServerReader<v1::PushBatchesRequest>* reader,
                                       v1::PushBatchesResponse* response) {
  if (!secret_.Admits(*context)) {
    log::WarnLimited(refused_log_, log::PeerHost(context->peer()), "internal call refused: no valid cluster secret",
                     {{"method", "BatchRelay.PushBatches"}, {"peer", context->peer()}});
    return ToGrpcStatus(absl::UnauthenticatedError("this endpoint serves the cluster's own processes only"));
  }
  jobs::JobManager* jobs = jobs_.load();
  if (jobs == nullptr) return ToGrpcStatus(absl::UnavailableError("the worker process is starting"));
  v1::PushBatchesRequest message;
  std::shared_ptr<jobs::StreamFeed> feed;
  std::string feed_id;
  absl::Status outcome;
  jobs::BatchAssembler assembler(jobs->max_batch_bytes());
  while (outcome.ok() && reader->Read(&message)) {
    if (!feed) {
      feed_id = message.job_id();
      if (feed_id.empty()) {
        outcome = absl::InvalidArgumentError("the first message names the job");
        break;
      }
      auto found = jobs->RelayedFeed(feed_id, kFeedWait);
      if (!found.ok()) {
        outcome = found.status();
        break;
      }
      feed = *std::move(found);
    }
    auto batch = assembler.Add(message);
    if (!batch.ok()) {
      outcome = batch.status();
    } else if (*batch != nullptr) {
      const bool counts = !(*batch)->inputs().empty();
      outcome = feed->Push(*(*batch)->mutable_inputs(), (*batch)->last());  // blocks while the feed is full
      if (outcome.ok() && counts) response->set_batches_received(response->batches_received() + 1);
    }
  }
  if (outcome.ok()) outcome = assembler.Finish();
  // The feed closed for the shutdown of this process (UNAVAILABLE): the job does not run again
  // (Scheduler::RunJob fails it), so the client must not read it as "retry".
  if (absl::IsUnavailable(outcome)) {
    outcome = absl::AbortedError(absl::StrCat(
        "the worker process running job ", feed_id, " is shutting down (", outcome.message(),
        "); the batches pushed to it are not kept: submit the job again and push from the first batch"));
  }
  return ToGrpcStatus(outcome);
}

}  // namespace recal::relay
