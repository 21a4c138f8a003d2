#include "server/jobs/task_builder.h"

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "server/data_access/data_roots.h"
#include "server/jobs/job_plan.h"
#include "server/jobs/store_retry.h"

namespace recal::jobs {
namespace {

// Blobs in a bucket: the model is fetched here, and an endpoint still away after the client's
// bounded retries fails the job (UNAVAILABLE) instead of holding the worker.
absl::StatusOr<store::BlobStore::HeldFile> ModelFile(const TaskSources& sources, const v1::Job& job,
                                                     const std::string& model_id, const std::atomic<bool>& cancel) {
  auto digest_of_model = [&] { return sources.models->DigestOf(job.tenant(), model_id); };
  auto still_ours = [&](const absl::Status&) { return !cancel; };
  RECAL_ASSIGN_OR_RETURN(const std::string digest, RetryWhileUnavailable(digest_of_model, still_ours));
  return sources.blobs->HoldLocalPath(digest);
}

// The shards' statistics into `scratch`, as the merge reads them (in shard order); their names.
absl::StatusOr<std::vector<std::string>> CopyShardStatistics(const TaskSources& sources,
                                                             const std::vector<v1::Job>& shards,
                                                             const std::filesystem::path& scratch) {
  std::vector<std::string> names;
  for (const v1::Job& shard : shards) {
    RECAL_ASSIGN_OR_RETURN(const store::ResultRef ref, sources.jobs->Result(shard.id(), v1::SHARD_STATISTICS));
    RECAL_ASSIGN_OR_RETURN(const std::unique_ptr<store::BlobReader> reader, sources.blobs->OpenReader(ref.sha256));
    std::string bytes;  // a few kB per layer
    RECAL_RETURN_IF_ERROR(reader->ReadAt(0, reader->size(), &bytes));
    std::string name = absl::StrCat("shard-", shard.shard(), ".safetensors");
    RECAL_RETURN_IF_ERROR(WriteFileAtomically((scratch / name).string(), bytes));
    names.push_back(std::move(name));
  }
  return names;
}

// The plan admission stored with the job; a job stored before plans were is planned now, as
// admission would have.
absl::StatusOr<worker::v1::JobPlan> StoredPlan(const TaskSources& sources, const v1::Job& job,
                                               const std::vector<std::string>& data_roots) {
  RECAL_ASSIGN_OR_RETURN(std::optional<worker::v1::JobPlan> stored, sources.jobs->Plan(job.id()));
  if (stored) return *std::move(stored);
  return PlanJob(job.spec(), data_roots);
}

// The roots may have changed since admission resolved the path (a restart with other
// --data_root flags): the job then fails with the reason, not with the sandbox's refusal to
// open the file. Not the guard (the sandbox is: resolved_data_source.h).
absl::Status CheckStillUnderRoots(const v1::DataSource& data, const std::vector<std::string>& data_roots) {
  const std::string& path = DataPath(data);
  if (path.empty()) return absl::OkStatus();
  RECAL_ASSIGN_OR_RETURN(const std::string resolved, data::ResolveUnderRoots(data_roots, path));
  if (resolved != path) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, " now resolves to ", resolved, ", not the path the job was admitted with; submit it again"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RecalibrationTask> BuildTask(const TaskSources& sources, const v1::Job& job,
                                            const TaskPurpose& purpose, const std::filesystem::path& scratch,
                                            const std::atomic<bool>& cancel) {
  RecalibrationTask task;
  const std::vector<std::string> data_roots = sources.data_roots->For(job.tenant());
  RECAL_ASSIGN_OR_RETURN(task.plan, StoredPlan(sources, job, data_roots));
  // Checked for a merge too, though it reads no data (the plan names the data in its report):
  // data that left the roots since the shards ran fails the job as it would fail a shard.
  RECAL_RETURN_IF_ERROR(CheckStillUnderRoots(task.plan.data(), data_roots));
  RECAL_ASSIGN_OR_RETURN(store::BlobStore::HeldFile model, ModelFile(sources, job, task.plan.model_id(), cancel));
  task.model_path = std::move(model.path);
  task.model_hold = std::move(model.hold);
  task.device = purpose.device;
  task.scratch_dir = scratch.string();
  if (purpose.merged_shards != nullptr) {
    // No data roots: the merge's sandbox reads none.
    RECAL_ASSIGN_OR_RETURN(task.merge_statistics, CopyShardStatistics(sources, *purpose.merged_shards, scratch));
    return task;
  }
  task.data_roots = data_roots;
  if (!job.parent_id().empty()) {
    task.shard_index = job.shard();
    task.shard_count = job.spec().shards();
  }
  return task;
}

}  // namespace recal::jobs
