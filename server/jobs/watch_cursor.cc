#include "server/jobs/watch_cursor.h"

#include <utility>

#include "common/now.h"

namespace recal::jobs {

WatchCursor::WatchCursor(WatchReads* reads, v1::Job snapshot, int64_t after_seq)
    : reads_(reads), job_id_(snapshot.id()), last_(after_seq) {
  snapshot_.set_seq(after_seq);
  *snapshot_.mutable_time() = NowTimestamp();
  *snapshot_.mutable_snapshot() = std::move(snapshot);
}

absl::StatusOr<WatchCursor::Step> WatchCursor::Next() {
  Step step;
  if (done_) {
    step.done = true;
    return step;
  }
  if (!snapshot_sent_) {
    snapshot_sent_ = true;
    step.events.push_back(snapshot_);
    return step;
  }
  while (true) {
    auto events = reads_->EventsAfter(job_id_, last_, kPage);
    if (!events.ok()) return events.status();
    for (v1::JobEvent& event : *events) {
      last_ = event.seq();
      const bool terminal = event.kind_case() == v1::JobEvent::kState && IsTerminal(event.state());
      step.events.push_back(std::move(event));
      if (terminal) {
        done_ = step.done = true;
        return step;
      }
    }
    if (!step.events.empty()) return step;
    // Nothing new: a job that ended before after_seq has nothing more to say.
    if (ended_) {
      done_ = step.done = true;
      return step;
    }
    auto now = reads_->Get(job_id_);
    if (!now.ok()) return now.status();
    if (!IsTerminal(now->state())) return step;  // wait for a change
    // It may have ended after the read above: its last events are read once more first.
    ended_ = true;
  }
}

}  // namespace recal::jobs
