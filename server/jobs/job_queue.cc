#include "server/jobs/job_queue.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace recal::jobs {

absl::Status JobQueue::Push(const std::string& job_id, int priority, bool force, const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!force && static_cast<int>(entries_.size()) >= capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the queue is full: ", capacity_, " jobs are waiting (--max_queued_jobs); retry later"));
  }
  entries_.emplace(-priority, arrivals_++, job_id, tenant);
  ready_.notify_one();
  return absl::OkStatus();
}

std::optional<std::string> JobQueue::Pop() {
  std::unique_lock<std::mutex> lock(mu_);
  ready_.wait(lock, [&] { return closed_ || !entries_.empty(); });
  if (closed_) return std::nullopt;
  // Among the highest priority's entries (in arrival order), the first of the tenant that
  // has waited longest since it was last served; a tenant never served goes first.
  auto chosen = entries_.begin();
  int64_t chosen_served = std::numeric_limits<int64_t>::max();
  for (auto it = entries_.begin(); it != entries_.end() && std::get<0>(*it) == std::get<0>(*entries_.begin()); ++it) {
    auto served = last_served_.find(std::get<3>(*it));
    const int64_t at = served == last_served_.end() ? -1 : served->second;
    if (at < chosen_served) {
      chosen = it;
      chosen_served = at;
    }
  }
  std::string id = std::get<2>(*chosen);
  last_served_[std::get<3>(*chosen)] = pops_++;
  entries_.erase(chosen);
  return id;
}

bool JobQueue::Remove(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (std::get<2>(*it) == job_id) {
      entries_.erase(it);
      return true;
    }
  }
  return false;
}

void JobQueue::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  ready_.notify_all();
}

int JobQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(entries_.size());
}

}  // namespace recal::jobs
