// How a job's model runs: the seam between scheduling (JobManager) and execution. The
// server's runner is WorkerRunner (a sandboxed recal-worker process per task); tests may
// put a fake behind it. Uploads are inspected through ModelInspector (model_inspector.h).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "recal/v1/recal.pb.h"
#include "recal/v1/report.pb.h"
#include "recal/worker/v1/worker.pb.h"

namespace recal::jobs {

struct RecalibrationTask {
  worker::v1::JobPlan plan;  // as stored with the job (job_plan.h)
  std::string model_path;    // the stored archive
  std::shared_ptr<void> model_hold;  // keeps model_path's file for as long as the task lives
  std::vector<std::string> data_roots;  // the job's tenant's: all the worker may read of the data
  std::string device;
  std::string scratch_dir;  // receives model.pt, bn.safetensors and report.json
  // A shard of a sharded job (shard_count > 1): scratch_dir receives statistics.safetensors.
  int shard_index = 0;
  int shard_count = 1;
  // The merge of a sharded job: the shards' statistics files in scratch_dir, in shard order.
  std::vector<std::string> merge_statistics;
};

// What a shard leaves in its scratch directory.
inline constexpr char kShardStatisticsFile[] = "statistics.safetensors";

struct RunHooks {
  // After every batch.
  std::function<void(const worker::v1::Progress&)> on_progress;
  // A client-stream job's next pushed batch; std::nullopt once the client sent the last.
  std::function<absl::StatusOr<std::optional<worker::v1::PushedBatch>>()> next_pushed;
  // Called once the run is over, to release a next_pushed() still waiting for the client.
  std::function<void()> release_pushed;
  // Checked from outside the model: once set, or once the deadline passes, the run ends
  // within a few seconds whatever the model does (CANCELLED / DEADLINE_EXCEEDED).
  const std::atomic<bool>* cancel = nullptr;
  absl::Time deadline = absl::InfiniteFuture();
};

class JobRunner {
 public:
  virtual ~JobRunner() = default;

  // Runs one recalibration to its end; its files are in task.scratch_dir when it succeeds.
  virtual absl::StatusOr<v1::RunReport> Recalibrate(const RecalibrationTask& task, const RunHooks& hooks) = 0;
};

}  // namespace recal::jobs
