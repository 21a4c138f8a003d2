// A sharded job's coordination, in the scheduler's coordinator threads: the job's progress
// is its shards' summed, and once every shard has succeeded the merge of their statistics
// (a sandboxed task: it loads the model) becomes the job's results. A shard that fails
// fails the job and cancels the others.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/leases.h"
#include "server/jobs/scheduler_options.h"
#include "server/jobs/scratch.h"
#include "server/jobs/stream_feed.h"
#include "server/jobs/task_builder.h"
#include "server/jobs/wake_signal.h"

namespace recal::jobs {

class ShardCoordinator {
 public:
  // `stop_here(id)` stops the run of shard `id` if it runs in this process. All pointers and
  // `options` outlive this.
  ShardCoordinator(const TaskSources& sources, JobRunner* runner, StreamFeeds* feeds, WakeSignal* wake,
                   const SchedulerOptions& options, std::function<void(const std::string&)> stop_here);

  // A sharded job's run: waits for its shards, then merges. CANCELLED once `flags.cancel` (the
  // shards cancelled too when by the user; after a shutdown or a lost lease they go on, and the
  // coordinator that takes the job up next finds them where they are); DEADLINE_EXCEEDED past
  // the job's timeout; a failed shard's error.
  absl::StatusOr<JobOutputs> Coordinate(const v1::Job& job, RunFlags& flags);
  // Stops the shards that have not ended (in the store; here at once).
  void CancelShards(const std::vector<v1::Job>& shards, const std::string& reason);

 private:
  // The shards once all have succeeded.
  absl::StatusOr<std::vector<v1::Job>> AwaitShards(const v1::Job& job, const RunFlags& flags, absl::Time deadline);
  // Where `shards` (just read) stand: true once all succeeded, false while some run, the
  // error of one that failed (the others cancelled). Publishes their summed progress.
  absl::StatusOr<bool> AllSucceeded(const v1::Job& job, const std::vector<v1::Job>& shards,
                                    v1::JobProgress& published);
  absl::StatusOr<JobOutputs> Merge(const v1::Job& job, const std::vector<v1::Job>& shards, RunFlags& flags,
                                   absl::Time deadline);

  const TaskSources sources_;
  JobRunner* runner_;
  StreamFeeds* feeds_;
  WakeSignal* wake_;
  const SchedulerOptions& options_;
  const std::function<void(const std::string&)> stop_here_;
};

}  // namespace recal::jobs
