#include "client/src/backoff.h"

#include <algorithm>
#include <cmath>

namespace recal::client_internal {

absl::Duration Backoff::Next() {
  const double exponent = std::min(attempt_++, 30);
  absl::Duration wait = options_.initial_backoff * std::pow(std::max(options_.multiplier, 1.0), exponent);
  wait = std::min(wait, options_.max_backoff);
  const double jitter = std::clamp(options_.jitter, 0.0, 1.0);
  if (jitter == 0) return wait;
  return wait * absl::Uniform(gen_, 1.0 - jitter, 1.0 + jitter);
}

bool ReconnectBudget::Wait() {
  const absl::Duration left = deadline_ - absl::Now();
  if (left <= absl::ZeroDuration()) return false;
  // The last wait is cut short so that one attempt still happens at the deadline.
  absl::SleepFor(std::min(backoff_.Next(), left));
  return true;
}

}  // namespace recal::client_internal
