// Tells watchers that some job's events changed, so that they read the store again. The
// events themselves are durable in the store; the hub carries only "look again". In one
// process a condition variable; the cluster mode puts PostgreSQL's LISTEN/NOTIFY (or polling
// on SQLite) behind the same calls.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "absl/time/time.h"

namespace recal::jobs {

class EventHub {
 public:
  // Changes whenever something was published: read it before reading the store.
  int64_t version() const;
  // After an event is durable (and on shutdown, to wake every watcher).
  void Publish();
  // Returns once version() != `seen`, or after `timeout` (watchers look again either way).
  void WaitForChange(int64_t seen, absl::Duration timeout) const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  int64_t version_ = 0;
};

}  // namespace recal::jobs
