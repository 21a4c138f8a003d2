// The store reads of a job's watchers, shared between them. One publish wakes every watcher
// of the job, and each would read the same new events (and, when there are none, the same
// job row) from the store: 10,000 watchers, 10,000 reads per progress event. A read is kept
// with the job's version in the hub (EventHub::JobVersion) taken before it; while that
// version stands nothing of the job was written since (each write of this process publishes
// once committed; another process's arrive as a publish for all), so the read is still the
// store's answer. For watchers only: they read again when the hub says so, and other readers
// (GetJob) do not go through it, as deletions and writes outside JobRepository publish nothing.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/event_hub.h"
#include "server/jobs/job_repository.h"

namespace recal::jobs {

class WatchReads {
 public:
  // `jobs` and `hub` (the one `jobs` publishes to) outlive this. Reads of at most `max_jobs`
  // jobs are kept, the least recently asked for dropped first.
  WatchReads(JobRepository* jobs, const EventHub* hub, size_t max_jobs = 128);

  // As JobRepository::EventsAfter.
  absl::StatusOr<std::vector<v1::JobEvent>> EventsAfter(const std::string& id, int64_t after_seq, int limit);
  // As JobRepository::Get.
  absl::StatusOr<v1::Job> Get(const std::string& id);

  // Reads that went to the store (for tests and the bench).
  int64_t store_reads() const;

 private:
  // A job's events after `after`, all of them up to the store's last when read at `version`.
  struct Events {
    int64_t version;
    int64_t after;
    std::vector<v1::JobEvent> events;
  };
  struct Kept {
    std::optional<Events> events;
    std::optional<std::pair<int64_t, v1::Job>> job;  // its version, the job
    std::list<std::string>::iterator recency;
  };
  // The job's entry, made most recent (made if absent, dropping the least recent beyond max_jobs_).
  Kept& Touch(const std::string& id);
  void Keep(const std::string& id, int64_t version, int64_t after, const std::vector<v1::JobEvent>& events);

  JobRepository* jobs_;
  const EventHub* hub_;
  const size_t max_jobs_;
  mutable std::mutex mu_;
  std::map<std::string, Kept> kept_;
  std::list<std::string> recency_;  // most recent first
  int64_t store_reads_ = 0;
};

}  // namespace recal::jobs
