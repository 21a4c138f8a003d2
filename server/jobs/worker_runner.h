// JobRunner (and ModelInspector) that runs every task in its own recal-worker process (server/worker), inside the
// sandbox (server/sandbox): the only way the server runs an uploaded model. The process is
// watched from outside: cancellation and the deadline end it (SIGTERM, then SIGKILL after
// `kill_grace`), and a worker that dies (signal, exit code, memory limit) fails its task
// with a message naming the cause; the server goes on. The process and its watchdog are
// worker_process.h's, what flows through its pipes worker_pipes.h's.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/data_access/object_storage.h"
#include "server/jobs/inspection_slots.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/model_inspector.h"
#include "server/jobs/worker_process.h"
#include "server/sandbox/memory_cgroup.h"

namespace recal::jobs {

struct WorkerRunnerOptions {
  std::string binary;                   // recal-worker
  std::string scratch_root;             // inspections get a directory here
  std::vector<std::string> data_roots;  // readable by jobs
  // Data in a bucket (s3:// data roots): read by the runner for its workers, which have no
  // network (remote_reads.h). Null: s3:// specs fail with FAILED_PRECONDITION.
  std::shared_ptr<data::ObjectStorage> object_storage;
  // A job's worker's memory cap; 0: none. Held by RLIMIT_AS on a CPU worker, and by the
  // worker's memory cgroup where there is one (memory_cgroup), on the CPU and on a GPU; a GPU
  // worker without a cgroup is held by RLIMIT_DATA (CUDA reserves terabytes of address space).
  int64_t memory_bytes = 0;
  // The cap of an inspecting worker, held as a job's is, far below it: an inspection only
  // loads the model. 0: memory_bytes.
  int64_t inspection_memory_bytes = 0;
  // Where each worker gets a cgroup of its own, limited to its cap (server/sandbox/
  // memory_cgroup.h): for a server, WorkerCgroupParent() or what --worker_memory_cgroup
  // says. Not OK: no cgroups, and why (said at start by CheckWorker).
  absl::StatusOr<sandbox::CgroupParent> memory_cgroup = absl::FailedPreconditionError("none asked for");
  // Tests: false holds a CPU worker as a GPU worker is held (no RLIMIT_AS; its cgroup, else
  // RLIMIT_DATA), so that a machine without a GPU tries the GPU's bounds.
  bool address_space_limit_on_cpu = true;
  // Admission of inspections on this host (count, summed memory caps), shared by whatever
  // calls Inspect here. Null: unbounded.
  std::shared_ptr<InspectionSlots> inspections;
  int64_t file_bytes = 0;               // RLIMIT_FSIZE per worker; 0: none
  std::string user;                     // run workers as this user; empty: the server's, without capabilities
  std::vector<std::string> extra_allowed_ops;
  int64_t max_graph_nodes = 0;          // 0: the engine's default
  int threads = 0;                      // intra-op threads per worker
  int prefetch_depth = 2;
  int decode_threads = 0;
  absl::Duration kill_grace = absl::Seconds(2);
  absl::Duration inspect_timeout = absl::Minutes(10);
};

// The number of CUDA devices recal-worker's LibTorch sees, for --devices (devices.h):
// `binary --print_cuda_devices`, in a worker's environment but outside the sandbox (it loads
// no model), within `timeout`; then, if it sees any, the same inside the GPU sandbox as
// `worker_user` (--worker_user; empty: the server's user), which must see them all
// (FAILED_PRECONDITION naming what keeps them). INTERNAL naming the binary if it cannot
// start, dies, fails or prints no count (with its last words); DEADLINE_EXCEEDED if it does
// not answer in time (it is killed).
absl::StatusOr<int> CountCudaDevices(const std::string& binary, const std::string& worker_user,
                                     absl::Duration timeout = absl::Minutes(1));

// recal-worker's command line for `task` in `scratch` (argv[0] is options.binary), joining
// the cgroup at `memory_cgroup` (empty: none). A task on a CUDA device gets --gpu and no
// --memory_bytes: CUDA reserves terabytes of address space, so RLIMIT_AS would fail its
// context creation (server/sandbox/sandbox.h); without a cgroup it gets --data_bytes.
std::vector<std::string> WorkerArguments(const WorkerRunnerOptions& options, const worker::v1::Task& task,
                                         const std::string& scratch, const std::string& memory_cgroup = "");

// The memory cap an inspecting worker gets (inspection_memory_bytes, else memory_bytes).
int64_t InspectionMemoryBytes(const WorkerRunnerOptions& options);

// Where this process's workers get their memory cgroups (sandbox::FindCgroupParent), found at
// the first call and kept for the process: in cgroup v2 finding it may move this process into
// a leaf group of its own, which must happen once.
const absl::StatusOr<sandbox::CgroupParent>& WorkerCgroupParent();

class WorkerRunner : public JobRunner, public ModelInspector {
 public:
  explicit WorkerRunner(WorkerRunnerOptions options);

  absl::StatusOr<v1::RunReport> Recalibrate(const RecalibrationTask& task, const RunHooks& hooks) override;
  absl::StatusOr<v1::Model> Inspect(const std::string& model_path) override;
  // A room holding a slot of options.inspections (none when it is null).
  absl::StatusOr<std::unique_ptr<Room>> Reserve(int64_t archive_bytes) override;

  // Asked once at start: what the sandbox enforces on this machine, from a worker that runs
  // LibTorch inside it (worker.proto's SelfCheck) under the tightest memory cap a CPU worker
  // gets (an inspection's or a job's), in its memory cgroup where there are any; where there
  // are none, `missing` says why and what holds the workers instead. FAILED_PRECONDITION
  // naming the cap and its flag when the worker fails under it but works without it;
  // otherwise how it failed.
  absl::StatusOr<worker::v1::Sandboxed> CheckWorker();
  // Tests: a worker tries what the sandbox must refuse.
  absl::StatusOr<worker::v1::ProbeResult> Probe(const worker::v1::SandboxProbe& probe);

 private:
  class HostRoom;
  // The inspection itself, in a room Reserve gave.
  absl::StatusOr<v1::Model> InspectInRoom(const std::string& model_path);
  // Starts a worker for `task`, feeds it, watches it and returns its last event (or why
  // there is none). `sandboxed` receives its first event. `remote`: the objects of the
  // task's data in a bucket, whose reads the worker asks for.
  absl::StatusOr<worker::v1::Event> Run(const worker::v1::Task& task, const std::string& model_path,
                                        const std::string& scratch, const RunHooks& hooks,
                                        worker::v1::Sandboxed* sandboxed = nullptr,
                                        const data::LocatedObjects* remote = nullptr);
  absl::StatusOr<worker::v1::Event> RunInScratch(const worker::v1::Task& task, const std::string& model_path,
                                                 const RunHooks& hooks, worker::v1::Sandboxed* sandboxed = nullptr);
  worker::v1::Task NewTask() const;
  // One worker given the self-check `task`: OK once it answered SelfChecked.
  absl::Status SelfCheck(const worker::v1::Task& task, worker::v1::Sandboxed* sandboxed);
  // The objects of the task's data when it is in a bucket (std::nullopt otherwise), found
  // here, where the network and the credentials are, before the worker starts.
  absl::StatusOr<std::optional<data::LocatedObjects>> LocateRemoteData(const RecalibrationTask& task) const;
  // The worker's own memory cgroup, limited to its cap, where `limits` say it gets one (null
  // otherwise). INTERNAL naming the file when it cannot be made: the task fails rather than
  // run without the bound.
  absl::StatusOr<std::unique_ptr<sandbox::MemoryCgroup>> MemoryCgroupFor(const WorkerLimits& limits) const;
  void LogGpuSandbox(const worker::v1::Sandboxed& sandboxed);
  // With --worker_user, the worker's scratch directory must be its own.
  absl::Status GiveToWorkerUser(const std::string& dir) const;

  const WorkerRunnerOptions options_;
  std::once_flag gpu_sandbox_logged_;
};

}  // namespace recal::jobs
