// The retention policy (docs/retention.md), applied by one background thread per server
// process: each tenant keeps the newest keep_versions versions of every model name and its
// ended jobs (with their results) for keep_results_days; uploads nobody appended to for
// upload_idle are removed, and so are stored-bytes reservations nobody touched for as long.
// Never what a queued or running job needs: a model version is deleted only by
// MetadataStore::DeleteModelUnlessUsed, which decides in the transaction that deletes it (a
// job submitted at the same time either keeps the model or fails cleanly), and only ended
// jobs are deleted.
//
// Cluster mode: every api replica sweeps (each has its own staged uploads with
// --blobs=s3://). Every step is idempotent and safe when replicas run it at once: a row
// another replica deleted first is NOT_FOUND and skipped, a blob is removed only once no row
// references it, and an expired upload is removed under its lock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/store/blob_store.h"
#include "server/store/metadata_store.h"

namespace recal::jobs {

// One tenant's retention; 0: keep everything.
struct RetentionPolicy {
  int64_t keep_versions = 0;
  int64_t keep_results_days = 0;
};
using RetentionFn = std::function<RetentionPolicy(const std::string& tenant)>;

struct SweeperOptions {
  RetentionFn retention;                       // none: keep every version and every job
  absl::Duration upload_idle = absl::Hours(24);  // <= 0: uploads never expire
  absl::Duration interval = absl::Minutes(10);
  std::function<absl::Time()> now = [] { return absl::Now(); };  // a fake clock in tests
};

// What one sweep did.
struct SweepCounts {
  int64_t models_deleted = 0;
  int64_t models_kept_for_jobs = 0;  // beyond keep_versions, but a queued or running job uses them
  int64_t jobs_deleted = 0;
  int64_t uploads_expired = 0;
  // Stored-bytes reservations not touched for upload_idle (MetadataStore::ExpireReservations).
  int64_t reservations_expired = 0;
};

class RetentionSweeper {
 public:
  RetentionSweeper(store::MetadataStore* metadata, store::BlobStore* blobs, SweeperOptions options);
  ~RetentionSweeper();  // Stop()

  // One pass over every tenant; the first error ends it (the next pass retries).
  absl::StatusOr<SweepCounts> SweepOnce();
  // The background thread: a pass at once, then every `interval`, each logged when it did
  // something or failed.
  void Start();
  void Stop();

 private:
  absl::Status SweepModels(SweepCounts& counts);
  absl::Status SweepJobs(SweepCounts& counts);
  // Deletes one model version beyond the tenant's keep_versions, unless a job needs it.
  absl::Status DeleteOldVersion(const v1::Model& model, SweepCounts& counts);
  RetentionPolicy PolicyOf(const std::string& tenant) const;

  store::MetadataStore* metadata_;
  store::BlobStore* blobs_;
  const SweeperOptions options_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace recal::jobs
