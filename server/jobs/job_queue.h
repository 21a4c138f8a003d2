// The queue of jobs waiting for a worker: bounded, highest priority first, FIFO within a
// priority. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
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
  absl::Status Push(const std::string& job_id, int priority, bool force = false);
  // Blocks until a job is there (returns it) or Close() was called (returns nullopt).
  std::optional<std::string> Pop();
  // True if it was waiting (and is no more).
  bool Remove(const std::string& job_id);
  void Close();
  int size() const;

 private:
  // (-priority, arrival, id): std::set orders it as the queue should run.
  using Entry = std::tuple<int, int64_t, std::string>;
  const int capacity_;
  mutable std::mutex mu_;
  std::condition_variable ready_;
  std::set<Entry> entries_;
  int64_t arrivals_ = 0;
  bool closed_ = false;
};

}  // namespace recal::jobs
