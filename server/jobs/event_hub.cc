#include "server/jobs/event_hub.h"

namespace recal::jobs {

int64_t EventHub::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

void EventHub::Publish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++version_;
  }
  changed_.notify_all();
}

void EventHub::WaitForChange(int64_t seen, absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return version_ != seen; });
}

}  // namespace recal::jobs
