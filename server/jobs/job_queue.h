// The queue of jobs waiting for a worker: bounded, highest priority first; within a
// priority, fair between tenants (the tenant served least recently goes next, so one
// tenant's fifty jobs do not hold back another's one), FIFO within a tenant. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>

#include "absl/status/status.h"

namespace recal::jobs {

class JobQueue {
 public:
  explicit JobQueue(int capacity) : capacity_(capacity) {}

  // RESOURCE_EXHAUSTED when `capacity` jobs wait already (unless `force`, used when
  // re-queueing jobs found at start-up or interrupted by shutdown).
  absl::Status Push(const std::string& job_id, int priority, bool force = false, const std::string& tenant = "");
  // Blocks until a job is there (returns it) or Close() was called (returns nullopt).
  std::optional<std::string> Pop();
  // True if it was waiting (and is no more).
  bool Remove(const std::string& job_id);
  void Close();
  int size() const;

 private:
  // (-priority, arrival, id, tenant): std::set orders it by priority, then arrival.
  using Entry = std::tuple<int, int64_t, std::string, std::string>;
  const int capacity_;
  mutable std::mutex mu_;
  std::condition_variable ready_;
  std::set<Entry> entries_;
  int64_t arrivals_ = 0;
  int64_t pops_ = 0;
  std::map<std::string, int64_t> last_served_;  // tenant -> pops_ when it last got a worker
  bool closed_ = false;
};

}  // namespace recal::jobs
