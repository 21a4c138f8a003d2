// The one place a job's RecalibrationTask is made, for a run of the job (or of a shard) and
// for the merge of a sharded job's statistics: its model in the blob store, the plan stored
// with it (job_plan.h), and what differs between the two.
#pragma once

#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/resolved_data_source.h"
#include "server/jobs/job_repository.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/model_registry.h"
#include "server/store/blob_store.h"

namespace recal::jobs {

// Where a task's inputs come from.
struct TaskSources {
  JobRepository* jobs;        // the shards' statistics, for a merge
  ModelRegistry* models;      // the job's model
  store::BlobStore* blobs;    // the model's file, the shards' statistics
  const DataRoots* data_roots;
};

// What a task does: run the job on `device` (a shard's part of it when the job is a shard),
// or merge the statistics of the sharded job's `shards` (all succeeded) on the CPU.
struct TaskPurpose {
  static TaskPurpose Run(std::string device) { return {std::move(device), nullptr}; }
  static TaskPurpose Merge(const std::vector<v1::Job>& shards) { return {"cpu", &shards}; }

  std::string device;
  const std::vector<v1::Job>* merged_shards;  // null: a run
};

// `job`'s task for `purpose`, its files to be written in `scratch` (where a merge's inputs,
// the shards' statistics, are copied). A store that is away while the model is looked up is
// waited out until `cancel` is set (store_retry.h).
absl::StatusOr<RecalibrationTask> BuildTask(const TaskSources& sources, const v1::Job& job,
                                            const TaskPurpose& purpose, const std::filesystem::path& scratch,
                                            const std::atomic<bool>& cancel);

}  // namespace recal::jobs
