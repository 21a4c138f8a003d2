#include "server/jobs/wake_signal.h"

namespace recal::jobs {

void WakeSignal::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++wakes_;
  }
  woken_.notify_all();
}

int64_t WakeSignal::Count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wakes_;
}

void WakeSignal::WaitAfter(int64_t seen, absl::Duration timeout, const std::atomic<bool>& stop) {
  std::unique_lock<std::mutex> lock(mu_);
  woken_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return wakes_ != seen || stop; });
}

}  // namespace recal::jobs
