#include "server/jobs/event_hub.h"

#include <utility>
#include <vector>

namespace recal::jobs {

int64_t EventHub::version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return version_;
}

int64_t EventHub::JobVersion(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return all_published_ + job_published_[std::hash<std::string>()(job_id) % kJobCounters];
}

void EventHub::Notify(std::multimap<std::string, int64_t>::iterator first,
                      std::multimap<std::string, int64_t>::iterator last, std::unique_lock<std::mutex>& lock) {
  std::vector<Wake> wakes;
  for (auto it = first; it != last; ++it) {
    auto sub = subscribers_.find(it->second);
    wakes.push_back(std::move(sub->second.wake));
    subscribers_.erase(sub);
  }
  by_job_.erase(first, last);
  lock.unlock();
  changed_.notify_all();
  // Outside the lock: a wake may subscribe again.
  for (Wake& wake : wakes) wake();
}

void EventHub::Publish(const std::string& job_id) {
  std::unique_lock<std::mutex> lock(mu_);
  ++version_;
  ++job_published_[std::hash<std::string>()(job_id) % kJobCounters];
  auto [first, last] = by_job_.equal_range(job_id);
  Notify(first, last, lock);
}

void EventHub::PublishAll() {
  std::unique_lock<std::mutex> lock(mu_);
  ++version_;
  ++all_published_;
  Notify(by_job_.begin(), by_job_.end(), lock);
}

void EventHub::WaitForChange(int64_t seen, absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return version_ != seen; });
}

int64_t EventHub::Subscribe(const std::string& job_id, int64_t seen, Wake wake) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t token = next_token_++;
  if (version_ != seen) {
    lock.unlock();
    wake();
    return token;
  }
  subscribers_.emplace(token, Subscriber{job_id, std::move(wake)});
  by_job_.emplace(job_id, token);
  return token;
}

bool EventHub::Unsubscribe(int64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  auto sub = subscribers_.find(token);
  if (sub == subscribers_.end()) return false;
  auto [first, last] = by_job_.equal_range(sub->second.job_id);
  for (auto it = first; it != last; ++it) {
    if (it->second == token) {
      by_job_.erase(it);
      break;
    }
  }
  subscribers_.erase(sub);
  return true;
}

int64_t EventHub::subscribers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(subscribers_.size());
}

}  // namespace recal::jobs
