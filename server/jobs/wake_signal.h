// What idle threads of the scheduler wait on: workers with no job, the lease reaper, and
// coordinators waiting for their shards. A count of wakes, so that a wake between reading
// the count and waiting is not lost.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "absl/time/time.h"

namespace recal::jobs {

class WakeSignal {
 public:
  // Wakes every waiter.
  void Wake();
  int64_t Count() const;
  // Returns after a Wake since Count() returned `seen`, once `stop` is set (and a Wake
  // follows), or after `timeout`.
  void WaitAfter(int64_t seen, absl::Duration timeout, const std::atomic<bool>& stop);

 private:
  mutable std::mutex mu_;
  std::condition_variable woken_;
  int64_t wakes_ = 0;
};

}  // namespace recal::jobs
