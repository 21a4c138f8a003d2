#include "server/jobs/job_queue.h"

#include "absl/strings/str_cat.h"

namespace recal::jobs {

absl::Status JobQueue::Push(const std::string& job_id, int priority, bool force) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!force && static_cast<int>(entries_.size()) >= capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the queue is full: ", capacity_, " jobs are waiting (--max_queued_jobs); retry later"));
  }
  entries_.emplace(-priority, arrivals_++, job_id);
  ready_.notify_one();
  return absl::OkStatus();
}

std::optional<std::string> JobQueue::Pop() {
  std::unique_lock<std::mutex> lock(mu_);
  ready_.wait(lock, [&] { return closed_ || !entries_.empty(); });
  if (closed_) return std::nullopt;
  std::string id = std::get<2>(*entries_.begin());
  entries_.erase(entries_.begin());
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
