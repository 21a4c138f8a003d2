#include "server/jobs/scratch.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/jobs/job_runner.h"

namespace recal::jobs {

namespace {

std::filesystem::path AttemptDir(const store::BlobStore& blobs, const std::string& job_id, int attempt) {
  return std::filesystem::path(blobs.scratch_dir()) / absl::StrCat(job_id, ".attempt-", attempt);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Scratch>> Scratch::Make(const store::BlobStore& blobs, const v1::Job& job) {
  std::error_code ignored;
  // Attempts count from 1; a job that never counted one (a test's) is attempt 0.
  for (int earlier = 0; earlier <= job.attempts(); ++earlier) {
    std::filesystem::remove_all(AttemptDir(blobs, job.id(), earlier), ignored);
  }
  std::filesystem::path path = AttemptDir(blobs, job.id(), job.attempts());
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", path.string(), ": ", error.message()));
  return std::unique_ptr<Scratch>(new Scratch(std::move(path)));
}

Scratch::~Scratch() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

ScratchFiles JobFiles(const v1::JobSpec& spec) {
  ScratchFiles files{{v1::MODEL, "model.pt"}, {v1::BN_BUFFERS, "bn.safetensors"}, {v1::REPORT, "report.json"}};
  // The worker's name for it (server/worker/worker_task.cc).
  if (spec.options().fold_batch_norm()) files.emplace_back(v1::FOLDED, "folded.pt2");
  return files;
}

const ScratchFiles& ShardFiles() {
  static const ScratchFiles* const files = new ScratchFiles{{v1::SHARD_STATISTICS, kShardStatisticsFile}};
  return *files;
}

absl::StatusOr<std::map<v1::Artifact, store::ResultRef>> AdoptResults(store::BlobStore& blobs,
                                                                      const std::filesystem::path& scratch,
                                                                      const ScratchFiles& files) {
  std::map<v1::Artifact, store::ResultRef> results;
  for (const auto& [artifact, name] : files) {
    RECAL_ASSIGN_OR_RETURN(std::string digest, blobs.AdoptFile((scratch / name).string()));
    RECAL_ASSIGN_OR_RETURN(int64_t size, blobs.SizeOf(digest));
    results[artifact] = {digest, size};
  }
  return results;
}

}  // namespace recal::jobs
