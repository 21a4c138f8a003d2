// One watcher's place in a job's events, read without waiting: the snapshot first (its seq
// is after_seq: it does not advance), then every event with seq > after_seq, ending once
// the terminal state has been read (or, for a job that ended before after_seq, once nothing
// is left after it). Whoever drives it decides how to wait between reads: a blocked thread
// or an EventHub subscription. Not thread-safe: one driver at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/watch_reads.h"

namespace recal::jobs {

class WatchCursor {
 public:
  // `snapshot` is the job as its caller may see it (checked by who opens the cursor).
  WatchCursor(WatchReads* reads, v1::Job snapshot, int64_t after_seq);

  struct Step {
    std::vector<v1::JobEvent> events;  // to deliver, in order
    bool done = false;                 // the last of them ends the watch (or nothing is left)
  };
  // What there is now. Reads the store, or what another watcher of the job read of it since
  // its last change (may block on it, never waits for events). An empty,
  // not done step: wait for the job to change (hub version read before this call), then
  // call again.
  absl::StatusOr<Step> Next();

  const std::string& job_id() const { return job_id_; }
  bool done() const { return done_; }

 private:
  static constexpr int kPage = 256;

  WatchReads* reads_;
  std::string job_id_;
  v1::JobEvent snapshot_;
  bool snapshot_sent_ = false;
  int64_t last_;
  bool ended_ = false;  // seen ended: the events read after that are all it will ever have
  bool done_ = false;
};

}  // namespace recal::jobs
