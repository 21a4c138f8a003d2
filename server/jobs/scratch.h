// A run's scratch directory, where the worker leaves its files, and the adoption of those
// files into the blob store as the job's results.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "recal/v1/report.pb.h"
#include "server/store/blob_store.h"
#include "server/store/metadata_store.h"

namespace recal::jobs {

// The scratch directory of one attempt at a job (under the blob store's scratch_dir(), which
// workers share on a file: blob store), removed when this goes. One per attempt, not per job:
// a run that lost its lease and ends late removes its own directory, never the files of the
// attempt that took the job over. Making attempt N removes what attempts before N left (a
// killed process's), since none of them can still store a result.
class Scratch {
 public:
  static absl::StatusOr<std::unique_ptr<Scratch>> Make(const store::BlobStore& blobs, const v1::Job& job);
  ~Scratch();
  const std::filesystem::path& path() const { return path_; }

 private:
  explicit Scratch(std::filesystem::path path) : path_(std::move(path)) {}
  const std::filesystem::path path_;
};

// What a run leaves in its scratch directory, by artifact: a job's or a merge's results, and
// a shard's statistics.
using ScratchFiles = std::vector<std::pair<v1::Artifact, std::string>>;
// A job's results; the folded model only where its spec asked for one.
ScratchFiles JobFiles(const v1::JobSpec& spec);
const ScratchFiles& ShardFiles();

// What a job's run ends with: its results in the blob store and the worker's report.
struct JobOutputs {
  std::map<v1::Artifact, store::ResultRef> results;
  v1::RunReport report;
};

// The run's `files` in `scratch` into the blob store (only plain files: AdoptFile refuses links).
absl::StatusOr<std::map<v1::Artifact, store::ResultRef>> AdoptResults(store::BlobStore& blobs,
                                                                      const std::filesystem::path& scratch,
                                                                      const ScratchFiles& files);

}  // namespace recal::jobs
