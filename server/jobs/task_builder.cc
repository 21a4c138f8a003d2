#include "server/jobs/task_builder.h"

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "server/jobs/store_retry.h"

namespace recal::jobs {
namespace {

// Blobs in a bucket: the model is fetched here, and an endpoint still away after the client's
// bounded retries fails the job (UNAVAILABLE) instead of holding the worker.
absl::StatusOr<std::string> ModelPath(const TaskSources& sources, const v1::Job& job,
                                      const std::atomic<bool>& cancel) {
  auto digest_of_model = [&] { return sources.models->DigestOf(job.tenant(), job.spec().model_id()); };
  auto still_ours = [&](const absl::Status&) { return !cancel; };
  RECAL_ASSIGN_OR_RETURN(const std::string digest, RetryWhileUnavailable(digest_of_model, still_ours));
  return sources.blobs->LocalPath(digest);
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

}  // namespace

absl::StatusOr<RecalibrationTask> BuildTask(const TaskSources& sources, const v1::Job& job,
                                            const TaskPurpose& purpose, const std::filesystem::path& scratch,
                                            const std::atomic<bool>& cancel) {
  const v1::JobSpec& spec = job.spec();
  RecalibrationTask task;
  task.spec = spec;
  RECAL_ASSIGN_OR_RETURN(task.model_path, ModelPath(sources, job, cancel));
  const std::vector<std::string> data_roots = sources.data_roots->For(job.tenant());
  // Checked for a merge too, though it reads no data (the spec names the data in its report):
  // data that left the roots since the shards ran fails the job as it would fail a shard.
  RECAL_ASSIGN_OR_RETURN(const std::string data_spec, DataSpecFor(spec.data(), data_roots));
  task.data_spec = spec.data().has_client_stream() ? "" : data_spec;
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
    task.shard_count = spec.shards();
  }
  return task;
}

}  // namespace recal::jobs
