#include "server/app/worker_options.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/data_access/object_storage.h"
#include "server/data_access/s3_paths.h"

namespace recal::app {
namespace {

// options.inspection_memory_total, or a quarter of the host's memory (MemTotal) but room for
// one inspection of `per_inspection` at least: what all inspecting workers together may hold,
// so that uploads cannot take the machine.
int64_t InspectionMemoryTotal(const ServerOptions& options, int64_t per_inspection) {
  if (options.inspection_memory_total > 0) return options.inspection_memory_total;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemTotal:") return std::max(kib * 1024 / 4, per_inspection);
    meminfo.ignore(64, '\n');
  }
  return 0;  // unknown: the count bound alone
}

absl::Status SetMemoryCgroup(const std::string& mode, jobs::WorkerRunnerOptions& worker) {
  if (mode == "off") {
    worker.memory_cgroup = absl::FailedPreconditionError("--worker_memory_cgroup=off");
    return absl::OkStatus();
  }
  if (mode != "auto" && mode != "required") {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_memory_cgroup=", mode, ": use auto, required or off"));
  }
  worker.memory_cgroup = jobs::WorkerCgroupParent();
  if (mode == "required" && !worker.memory_cgroup.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--worker_memory_cgroup=required, but no memory cgroup can be made for the workers: ",
                     worker.memory_cgroup.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string WorkerBinary(const ServerOptions& options) {
  if (!options.worker_binary.empty()) return options.worker_binary;
  std::error_code error;
  return (std::filesystem::read_symlink("/proc/self/exe", error).parent_path() / "recal-worker").string();
}

absl::StatusOr<jobs::WorkerRunnerOptions> WorkerRunnerOptionsFor(const ServerOptions& options, std::string binary,
                                                                 std::string scratch_root) {
  jobs::WorkerRunnerOptions worker;
  worker.binary = std::move(binary);
  worker.scratch_root = std::move(scratch_root);
  worker.data_roots = options.data_roots.All();
  // Read by this process for its sandboxed workers, which have no network.
  if (std::any_of(worker.data_roots.begin(), worker.data_roots.end(),
                  [](const std::string& root) { return data::IsS3Path(root); })) {
    RECAL_ASSIGN_OR_RETURN(auto settings, data::ObjectStorageOptions(options.s3));
    RECAL_ASSIGN_OR_RETURN(worker.object_storage, data::ConnectBucket(settings));
  }
  worker.memory_bytes = options.job_memory_bytes;
  RECAL_RETURN_IF_ERROR(SetMemoryCgroup(options.worker_memory_cgroup, worker));
  worker.file_bytes = options.job_file_bytes > 0 ? options.job_file_bytes : 2 * options.max_model_bytes;
  worker.inspection_memory_bytes = options.inspection_memory_bytes;
  worker.inspections = std::make_shared<jobs::InspectionSlots>(
      jobs::InspectionBounds{options.max_concurrent_inspections,
                             InspectionMemoryTotal(options, jobs::InspectionMemoryBytes(worker)), 0,
                             options.inspection_wait});
  worker.user = options.worker_user;
  worker.extra_allowed_ops = options.extra_allowed_ops;
  worker.max_graph_nodes = options.max_graph_nodes;
  worker.threads = options.threads_per_worker;
  worker.prefetch_depth = std::max(0, options.prefetch_depth);
  worker.decode_threads = std::max(0, options.decode_threads);
  return worker;
}

}  // namespace recal::app
