#include "server/api/watch_job_reactor.h"

#include <utility>

#include "common/grpc_status.h"
#include "server/metrics/metrics.h"

namespace recal::api {
namespace {

class RefusedWatch final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  explicit RefusedWatch(grpc::Status status) { Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<v1::JobEvent>* WatchJobReactor::Refuse(grpc::Status status) {
  return new RefusedWatch(std::move(status));
}

WatchJobReactor::WatchJobReactor(jobs::JobManager* jobs, TaskPool* reads, jobs::Caller caller, std::string id,
                                 int64_t after_seq, metrics::Metrics* metrics)
    : jobs_(jobs),
      reads_(reads),
      caller_(std::move(caller)),
      id_(std::move(id)),
      after_seq_(after_seq),
      metrics_(metrics) {
  if (metrics_) metrics_->watch_streams.Increment();
  std::unique_lock<std::mutex> lock(mu_);
  PostPull(lock);
}

void WatchJobReactor::PostPull(std::unique_lock<std::mutex>& /*held*/) {
  pulling_ = true;
  reads_->Post([this] { Pull(); });
}

void WatchJobReactor::EndWith(grpc::Status status) {
  if (!outcome_) outcome_ = std::move(status);
}

WatchJobReactor::Then WatchJobReactor::FinishIfIdle() {
  Then then;
  if (outcome_ && !finished_ && !pulling_ && !writing_ && token_ == 0) {
    finished_ = true;
    then.finish = *outcome_;
  }
  return then;
}

void WatchJobReactor::Do(Then then) {
  if (then.write != nullptr) StartWrite(then.write);
  if (then.finish) Finish(*std::move(then.finish));  // may delete this: last
}

void WatchJobReactor::Pull() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    woken_ = false;
    if (outcome_) break;
    lock.unlock();
    // The version before the reads: a change after it wakes the subscription below at once.
    const int64_t version = jobs_->events().version();
    absl::StatusOr<jobs::WatchCursor::Step> step;
    if (jobs_->stopping()) {
      step = absl::UnavailableError("the server is shutting down; watch again");
    } else if (!cursor_) {
      auto opened = jobs_->OpenWatch(caller_, id_, after_seq_);
      if (opened.ok()) cursor_ = *std::move(opened);
      step = opened.ok() ? cursor_->Next() : opened.status();
    } else {
      step = cursor_->Next();
    }
    lock.lock();
    if (!step.ok()) {
      EndWith(ToGrpcStatus(step.status()));
      break;
    }
    if (outcome_) break;
    if (!step->events.empty()) {
      for (v1::JobEvent& event : step->events) pending_.push_back(std::move(event));
      cursor_done_ = step->done;
      pulling_ = false;
      writing_ = true;
      Then then;
      then.write = &pending_.front();
      lock.unlock();
      Do(then);
      return;
    }
    if (step->done) {
      EndWith(grpc::Status::OK);
      break;
    }
    lock.unlock();
    const int64_t token = jobs_->events().Subscribe(id_, version, [this] { Wake(); });
    lock.lock();
    if (woken_) continue;  // changed meanwhile (or at once): read again
    token_ = token;
    pulling_ = false;
    if (outcome_ && jobs_->events().Unsubscribe(token)) token_ = 0;
    Then then = FinishIfIdle();
    lock.unlock();
    Do(then);
    return;
  }
  pulling_ = false;
  Then then = FinishIfIdle();
  lock.unlock();
  Do(then);
}

void WatchJobReactor::Wake() {
  std::unique_lock<std::mutex> lock(mu_);
  if (pulling_) {
    woken_ = true;
    return;
  }
  token_ = 0;
  if (!outcome_) {
    PostPull(lock);
    return;
  }
  Then then = FinishIfIdle();
  lock.unlock();
  Do(then);
}

void WatchJobReactor::OnWriteDone(bool ok) {
  std::unique_lock<std::mutex> lock(mu_);
  writing_ = false;
  pending_.pop_front();
  if (!ok) EndWith(grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away"));
  Then then;
  if (!outcome_ && !pending_.empty()) {
    writing_ = true;
    then.write = &pending_.front();
  } else if (!outcome_ && cursor_done_) {
    EndWith(grpc::Status::OK);
    then = FinishIfIdle();
  } else if (!outcome_) {
    PostPull(lock);
  } else {
    then = FinishIfIdle();
  }
  lock.unlock();
  Do(then);
}

void WatchJobReactor::OnCancel() {
  std::unique_lock<std::mutex> lock(mu_);
  EndWith(grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away"));
  // A subscription that already fired is ended by its Wake.
  if (token_ != 0 && jobs_->events().Unsubscribe(token_)) token_ = 0;
  Then then = FinishIfIdle();
  lock.unlock();
  Do(then);
}

void WatchJobReactor::OnDone() {
  if (metrics_) metrics_->watch_streams.Decrement();
  delete this;
}

}  // namespace recal::api
