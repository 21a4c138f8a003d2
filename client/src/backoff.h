// Exponential backoff with jitter between attempts, and which failures are worth another.
#pragma once

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "recal/client.h"

namespace recal::client_internal {

// Waits initial, initial*m, initial*m^2, ... up to max, each scaled by a random factor in
// [1 - jitter, 1 + jitter] so that many clients cut off at once do not come back in step.
class Backoff {
 public:
  explicit Backoff(const RetryOptions& options) : options_(options) {}

  absl::Duration Next();
  void Reset() { attempt_ = 0; }

 private:
  RetryOptions options_;
  int attempt_ = 0;
  absl::BitGen gen_;
};

// UNAVAILABLE is what gRPC reports for a server that is down, restarting, shutting down
// (the server says "watch again") or unreachable; every other code is the server's answer
// and repeating the call would get the same one.
inline bool IsRetryable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable;
}

// A stream that may be picked up again until the server has been silent for `timeout`
// (the clock restarts on progress).
class ReconnectBudget {
 public:
  explicit ReconnectBudget(const ClientOptions& options)
      : backoff_(options.retry), timeout_(options.reconnect_timeout), deadline_(absl::Now() + timeout_) {}

  void Progress() {
    backoff_.Reset();
    deadline_ = absl::Now() + timeout_;
  }
  // Sleeps before the next attempt; false (without sleeping) once the deadline has passed.
  bool Wait();

 private:
  Backoff backoff_;
  absl::Duration timeout_;
  absl::Time deadline_;
};

}  // namespace recal::client_internal
