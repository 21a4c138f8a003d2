// WatchJob without a thread per watcher: a gRPC write reactor that pulls from a
// jobs::WatchCursor. Store reads run on a small TaskPool (never on gRPC's callback threads);
// between reads the watcher waits as an EventHub subscription on its job, holding no thread.
// One write in flight at a time. Ends OK after the terminal state, CANCELLED when the client
// goes away, UNAVAILABLE ("watch again") when the server shuts down.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/task_pool.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/job_manager.h"

namespace recal::metrics {
struct Metrics;
}

namespace recal::api {

class WatchJobReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
 public:
  // Starts at once: opening the watch (which checks the caller may see the job) is the first
  // read. `metrics` may be null; the reactor deletes itself once gRPC is done with it.
  WatchJobReactor(jobs::JobManager* jobs, TaskPool* reads, jobs::Caller caller, std::string id, int64_t after_seq,
                  metrics::Metrics* metrics);

  // A call refused before any watching (authentication, bounds): ends with `status`.
  static grpc::ServerWriteReactor<v1::JobEvent>* Refuse(grpc::Status status);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // What a handler does once its lock is released: at most one of them.
  struct Then {
    const v1::JobEvent* write = nullptr;
    std::optional<grpc::Status> finish;
  };
  void Pull();  // on reads_, with pulling_ set
  void Wake();  // the hub's callback: the job changed
  void PostPull(std::unique_lock<std::mutex>& lock);
  void EndWith(grpc::Status status);  // the first outcome wins
  // Finishes once nothing is in flight (no read, write or subscription).
  Then FinishIfIdle();
  void Do(Then then);

  jobs::JobManager* const jobs_;
  TaskPool* const reads_;
  const jobs::Caller caller_;
  const std::string id_;
  const int64_t after_seq_;
  metrics::Metrics* const metrics_;
  std::unique_ptr<jobs::WatchCursor> cursor_;  // touched by Pull only

  std::mutex mu_;
  bool pulling_ = false;  // a Pull is posted or running
  bool woken_ = false;    // Wake ran while Pull was subscribing: read again
  bool writing_ = false;  // pending_.front() is being written
  int64_t token_ = 0;     // the hub subscription waiting now, 0: none
  std::deque<v1::JobEvent> pending_;
  bool cursor_done_ = false;  // pending_ holds the last events there will be
  std::optional<grpc::Status> outcome_;
  bool finished_ = false;
};

}  // namespace recal::api
