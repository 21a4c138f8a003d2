// Tells watchers that some job's events changed, so that they read the store again. The
// events themselves are durable in the store; the hub carries only "look again". Two kinds
// of watcher: a thread that blocks (WaitForChange, a condition variable) and a waiter that
// holds no thread (Subscribe: a callback run once on the next publish for its job, or on a
// publish for all). In the cluster mode PostgreSQL's LISTEN/NOTIFY (or polling on SQLite)
// arrives as a publish for all, since it does not say which job changed.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "absl/time/time.h"

namespace recal::jobs {

class EventHub {
 public:
  using Wake = std::function<void()>;

  // Changes whenever something was published: read it before reading the store.
  int64_t version() const;
  // Changes whenever something was published for `job_id` (or for all), and seldom else (jobs
  // share a few counters): what was read of the job after reading it is still the store's
  // answer while it stands.
  int64_t JobVersion(const std::string& job_id) const;
  // After an event of job `job_id` is durable: wakes the blocked waiters and the
  // subscribers of that job only.
  void Publish(const std::string& job_id);
  // Something changed that names no job (another server's notification, shutdown): wakes
  // every waiter and every subscriber.
  void PublishAll();
  // Returns once version() != `seen`, or after `timeout` (watchers look again either way).
  void WaitForChange(int64_t seen, absl::Duration timeout) const;

  // Runs `wake` once, on the first publish for `job_id` (or for all) after this call, unless
  // version() != `seen` already: then it runs at once, on this thread, so that a change
  // between the caller's store read and this call is never lost. `wake` runs without the
  // hub's lock and must not block. Returns a token for Unsubscribe.
  int64_t Subscribe(const std::string& job_id, int64_t seen, Wake wake);
  // Drops a subscription that has not run yet; false if it ran (or is running) already.
  bool Unsubscribe(int64_t token);
  // Subscriptions waiting now (a gauge for tests and metrics).
  int64_t subscribers() const;

 private:
  struct Subscriber {
    std::string job_id;
    Wake wake;
  };
  void Notify(std::multimap<std::string, int64_t>::iterator first,
              std::multimap<std::string, int64_t>::iterator last, std::unique_lock<std::mutex>& lock);

  mutable std::mutex mu_;
  mutable std::condition_variable changed_;
  int64_t version_ = 0;
  // JobVersion: publishes for all, plus those for the jobs that share the job's counter.
  static constexpr size_t kJobCounters = 1024;
  int64_t all_published_ = 0;
  std::array<int64_t, kJobCounters> job_published_{};
  int64_t next_token_ = 1;
  std::map<int64_t, Subscriber> subscribers_;        // by token
  std::multimap<std::string, int64_t> by_job_;       // job id -> token
};

}  // namespace recal::jobs
