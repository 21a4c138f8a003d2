// Watch: follow a job's events to the end, reconnecting from the last seq seen.
#include "client/src/client_impl.h"

namespace recal {
namespace {

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

}  // namespace

absl::StatusOr<v1::Job> Client::Watch(const std::string& job_id, const EventCallback& on_event,
                                      int64_t after_seq) {
  int64_t last_seq = after_seq;
  client_internal::ReconnectBudget budget(options_);
  while (true) {
    grpc::ClientContext context;
    impl_->Prepare(&context, /*unary=*/false);
    v1::WatchJobRequest request;
    request.set_id(job_id);
    request.set_after_seq(last_seq);
    auto reader = impl_->stub->WatchJob(&context, request);
    v1::JobEvent event;
    bool ended = false;         // a terminal state event arrived
    bool ended_before = false;  // the snapshot shows a job that had ended already
    while (reader->Read(&event)) {
      budget.Progress();
      if (event.has_snapshot()) {
        ended_before = IsTerminal(event.snapshot().state());
      } else {
        if (event.seq() <= last_seq) continue;  // delivered before the reconnection
        last_seq = event.seq();
        ended |= event.kind_case() == v1::JobEvent::kState && IsTerminal(event.state());
      }
      if (on_event) on_event(event);
    }
    const absl::Status finished = FromGrpcStatus(reader->Finish());
    // The server closes the stream after the terminal state, or right after the snapshot
    // when the job ended before after_seq; then the Job as stored is the answer.
    if (ended || (finished.ok() && ended_before)) return Get(job_id);
    // UNAVAILABLE: the server went away or is shutting down ("watch again"). An OK end
    // without the terminal state should not happen; it is treated the same way.
    const absl::Status broken = finished.ok() ? absl::UnavailableError("the watch ended early") : finished;
    if (!client_internal::IsRetryable(broken) || !budget.Wait()) return impl_->Explain(broken);
  }
}

}  // namespace recal
