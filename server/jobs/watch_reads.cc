#include "server/jobs/watch_reads.h"

#include <algorithm>
#include <utility>

namespace recal::jobs {
namespace {

// A read of more is left to the store each time: a summary event carries a whole report.
constexpr size_t kMaxKeptBytes = 1 << 20;

size_t BytesOf(const std::vector<v1::JobEvent>& events) {
  size_t bytes = 0;
  for (const v1::JobEvent& event : events) bytes += event.ByteSizeLong();
  return bytes;
}

}  // namespace

WatchReads::WatchReads(JobRepository* jobs, const EventHub* hub, size_t max_jobs)
    : jobs_(jobs), hub_(hub), max_jobs_(std::max<size_t>(1, max_jobs)) {}

int64_t WatchReads::store_reads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return store_reads_;
}

WatchReads::Kept& WatchReads::Touch(const std::string& id) {
  auto it = kept_.find(id);
  if (it != kept_.end()) {
    recency_.splice(recency_.begin(), recency_, it->second.recency);
    return it->second;
  }
  if (kept_.size() >= max_jobs_) {
    kept_.erase(recency_.back());
    recency_.pop_back();
  }
  recency_.push_front(id);
  Kept& kept = kept_[id];
  kept.recency = recency_.begin();
  return kept;
}

absl::StatusOr<std::vector<v1::JobEvent>> WatchReads::EventsAfter(const std::string& id, int64_t after_seq,
                                                                  int limit) {
  const int64_t version = hub_->JobVersion(id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::optional<Events>& kept = Touch(id).events;
    if (kept && kept->version == version && kept->after <= after_seq) {
      auto first = std::upper_bound(kept->events.begin(), kept->events.end(), after_seq,
                                    [](int64_t seq, const v1::JobEvent& event) { return seq < event.seq(); });
      const auto count = std::min<ptrdiff_t>(std::max(limit, 0), kept->events.end() - first);
      return std::vector<v1::JobEvent>(first, first + count);
    }
    ++store_reads_;
  }
  absl::StatusOr<std::vector<v1::JobEvent>> read = jobs_->EventsAfter(id, after_seq, limit);
  // Fewer than asked for: everything up to the store's last event.
  if (read.ok() && static_cast<int>(read->size()) < limit) Keep(id, version, after_seq, *read);
  return read;
}

void WatchReads::Keep(const std::string& id, int64_t version, int64_t after, const std::vector<v1::JobEvent>& events) {
  if (BytesOf(events) > kMaxKeptBytes) return;
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<Events>& kept = Touch(id).events;
  // What is kept already may hold more of the same version (read from further back).
  if (kept && kept->version == version && kept->after <= after) return;
  if (kept && kept->version > version) return;  // newer: this read is stale already
  kept = Events{version, after, events};
}

absl::StatusOr<v1::Job> WatchReads::Get(const std::string& id) {
  const int64_t version = hub_->JobVersion(id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto& kept = Touch(id).job;
    if (kept && kept->first == version) return kept->second;
    ++store_reads_;
  }
  absl::StatusOr<v1::Job> read = jobs_->Get(id);
  if (read.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& kept = Touch(id).job;
    if (!kept || kept->first < version) kept.emplace(version, *read);
  }
  return read;
}

}  // namespace recal::jobs
