#include "server/jobs/worker_runner.h"

#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <mutex>
#include <optional>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/data_source.h"
#include "server/data_access/locate_objects.h"
#include "server/data_access/s3_paths.h"
#include "server/jobs/remote_reads.h"
#include "server/jobs/worker_pipes.h"
#include "server/jobs/worker_process.h"
#include "server/log/log.h"

namespace recal::jobs {
namespace {

namespace wire = worker::v1;
namespace fs = std::filesystem;

// The outcome of a task whose last event should be `expected`: the worker's own failure
// keeps its code (INVALID_ARGUMENT for a refused model, NOT_FOUND for missing data...).
absl::StatusOr<wire::Event> Expect(absl::StatusOr<wire::Event> event, wire::Event::KindCase expected) {
  if (!event.ok()) return event.status();
  if (event->has_failure()) {
    return absl::Status(static_cast<absl::StatusCode>(event->failure().code()), event->failure().message());
  }
  if (event->kind_case() != expected) return absl::InternalError("the worker answered with the wrong event");
  return event;
}

// OK for a clean exit, else what happened to the worker asked `question`, with its last words.
absl::Status ExitOf(const std::string& question, int status, const std::string& err) {
  if (ExitedCleanly(status)) return absl::OkStatus();
  const std::string why = LastLine(err);
  return absl::InternalError(absl::StrCat(question, " ", HowItEnded(status), why.empty() ? "" : ": ", why));
}

bool OnGpu(const wire::Task& task) {
  return task.has_recalibrate() && absl::StartsWith(task.recalibrate().device(), "cuda");
}

// What holds a worker's memory cap, in words: "RLIMIT_AS and its memory cgroup".
std::string HeldBy(const WorkerLimits& limits) {
  std::vector<std::string> by;
  if (limits.rlimit == MemoryRlimit::kAddressSpace) by.push_back("RLIMIT_AS");
  if (limits.rlimit == MemoryRlimit::kData) by.push_back("RLIMIT_DATA");
  if (limits.cgroup) by.push_back("its memory cgroup");
  return absl::StrJoin(by, " and ");
}

// LibTorch's words when the host allocator is refused (c10's alloc_cpu.cpp): under a memory
// rlimit, that limit, which the worker cannot name and the runner can.
constexpr absl::string_view kHostAllocationRefused = "DefaultCPUAllocator: can't allocate memory";

wire::Event NamingTheLimit(wire::Event event, const WorkerLimits& limits) {
  if (!event.has_failure() || limits.rlimit == MemoryRlimit::kNone ||
      !absl::StrContains(event.failure().message(), kHostAllocationRefused)) {
    return event;
  }
  absl::StrAppend(event.mutable_failure()->mutable_message(), " (the worker's memory limit: ", limits.memory_bytes,
                  " bytes (", limits.memory_flag, "), held by ", HeldBy(limits), ". Raise ", limits.memory_flag,
                  " for this model, or run it with a smaller batch_size)");
  return event;
}

// What a run came to: the watchdog's stop first, then a feed that failed the job, then the
// worker's last event if it exited cleanly, else how it ended.
// `killed_for_protocol`: the worker was alive when the runner killed it for breaking the
// protocol, so its SIGKILL is the runner's, not the out-of-memory killer's.
absl::StatusOr<wire::Event> RunOutcome(WorkerWatchdog::Stop stopped_by, const absl::Status& feed_error,
                                       WorkerEvents events, int wait_status, bool killed_for_protocol,
                                       const std::string& last_words, const WorkerLimits& limits,
                                       int64_t cgroup_oom_kills) {
  if (stopped_by == WorkerWatchdog::Stop::kCancelled) return absl::CancelledError("cancelled");
  if (stopped_by == WorkerWatchdog::Stop::kPastDeadline) {
    return absl::DeadlineExceededError("the job ran past its deadline; its worker was stopped");
  }
  if (!feed_error.ok()) return feed_error;
  if (events.last && ExitedCleanly(wait_status)) return NamingTheLimit(*std::move(events.last), limits);
  // A worker that died of a signal may leave a torn event behind: then the signal is the cause.
  if (!events.protocol.ok() && (killed_for_protocol || !WIFSIGNALED(wait_status))) {
    return absl::InternalError(absl::StrCat("the worker broke the protocol: ", events.protocol.message()));
  }
  return WorkerFailure(wait_status, last_words, limits, cgroup_oom_kills);
}

// One `recal-worker --print_cuda_devices [extra]`: its count, and its stderr (where a worker
// that sees no device says what the driver answered).
struct CudaCount {
  int count = 0;
  std::string err;
};

absl::StatusOr<CudaCount> AskCudaDevices(const std::string& binary, const std::vector<std::string>& extra,
                                         absl::Duration timeout) {
  std::vector<std::string> args = {binary, "--print_cuda_devices"};
  args.insert(args.end(), extra.begin(), extra.end());
  const std::string question = absl::StrJoin(args, " ");
  // stdin from /dev/null, stdout and stderr on pipes.
  Fd out_read, out_write, err_read, err_write;
  RECAL_RETURN_IF_ERROR(Pipe(out_read, out_write));
  RECAL_RETURN_IF_ERROR(Pipe(err_read, err_write));
  RECAL_ASSIGN_OR_RETURN(std::unique_ptr<WorkerProcess> process,
                         WorkerProcess::Spawn(args, {-1, out_write.get(), err_write.get()}));
  out_write.reset();
  err_write.reset();
  const absl::Time deadline = absl::Now() + timeout;
  std::string out;
  CudaCount answer;
  absl::StatusOr<bool> answered = ReadUntilClosed(out_read, err_read, deadline, &out, &answer.err);
  const bool exited = process->WaitUntil(answered.ok() ? deadline : absl::Now());
  if (!answered.ok()) return answered.status();
  if (!*answered || !exited) {
    return absl::DeadlineExceededError(absl::StrCat(question, " did not answer within ", absl::FormatDuration(timeout)));
  }
  RECAL_RETURN_IF_ERROR(ExitOf(question, process->wait_status(), answer.err));
  if (!absl::SimpleAtoi(out, &answer.count) || answer.count < 0) {
    return absl::InternalError(absl::StrCat(question, " printed '", absl::CHexEscape(LastLine(out)),
                                            "', not a number of devices"));
  }
  return answer;
}

wire::RemoteObjects RemoteObjectsOf(const data::LocatedObjects& located) {
  wire::RemoteObjects objects;
  objects.set_bucket(located.bucket);
  for (const s3::ObjectInfo& object : located.objects) {
    wire::RemoteObject* out = objects.add_objects();
    out->set_key(object.key);
    out->set_size(object.size);
  }
  return objects;
}

}  // namespace

// Counted as LibTorch sees them, then inside the GPU sandbox a job gets, as the user its
// workers run as: a sandbox (or a user) that keeps the driver from something it needs (as the
// H200's first run found) is said at start, with the driver's answer, not at every job, and
// never taken for a machine without GPUs.
absl::StatusOr<int> CountCudaDevices(const std::string& binary, const std::string& worker_user,
                                     absl::Duration timeout) {
  RECAL_ASSIGN_OR_RETURN(const CudaCount plain, AskCudaDevices(binary, {}, timeout));
  if (plain.count == 0) return 0;
  std::vector<std::string> sandboxed_args = {"--gpu"};
  if (!worker_user.empty()) sandboxed_args.push_back("--user=" + worker_user);
  RECAL_ASSIGN_OR_RETURN(const CudaCount sandboxed, AskCudaDevices(binary, sandboxed_args, timeout));
  if (sandboxed.count >= plain.count) return plain.count;
  if (!worker_user.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        binary, " sees ", plain.count, " CUDA device(s), but ", sandboxed.count,
        " inside the GPU sandbox as --worker_user=", worker_user, " (", LastLine(sandboxed.err),
        "): that user may not open the NVIDIA device files. Give it their group (ls -l /dev/nvidia*; "
        "often `usermod -aG video ", worker_user, "`), or run on --devices=cpu meanwhile"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      binary, " sees ", plain.count, " CUDA device(s), but ", sandboxed.count, " inside the GPU sandbox its jobs run in (",
      LastLine(sandboxed.err),
      "): the sandbox refuses the NVIDIA driver something it needs, so no GPU job could run. Report it "
      "with this message (docs/gpu.md), or run on --devices=cpu meanwhile"));
}

int64_t InspectionMemoryBytes(const WorkerRunnerOptions& options) {
  return options.inspection_memory_bytes > 0 ? options.inspection_memory_bytes : options.memory_bytes;
}

namespace {

// The caps the worker of `task` gets: an inspecting one its own, lower memory cap, the
// start's self check the tightest a CPU worker gets, every other a job's.
WorkerLimits CapsOf(const WorkerRunnerOptions& options, const wire::Task& task) {
  const WorkerLimits job{options.file_bytes, options.memory_bytes, "--job_memory_bytes"};
  const WorkerLimits inspection =
      options.inspection_memory_bytes > 0
          ? WorkerLimits{options.file_bytes, options.inspection_memory_bytes, "--inspection_memory_bytes"}
          : job;
  if (task.has_inspect()) return inspection;
  if (task.has_self_check() && inspection.memory_bytes > 0 &&
      (job.memory_bytes == 0 || inspection.memory_bytes < job.memory_bytes)) {
    return inspection;
  }
  return job;
}

// The caps of `task` and what holds its memory cap: its cgroup where there are any, and
// RLIMIT_AS on a CPU worker; a GPU worker no RLIMIT_AS (CUDA reserves terabytes of address
// space), but RLIMIT_DATA where it has no cgroup.
WorkerLimits LimitsOf(const WorkerRunnerOptions& options, const wire::Task& task) {
  WorkerLimits limits = CapsOf(options, task);
  if (limits.memory_bytes <= 0) return limits;
  limits.cgroup = options.memory_cgroup.ok();
  if (!OnGpu(task) && options.address_space_limit_on_cpu) {
    limits.rlimit = MemoryRlimit::kAddressSpace;
  } else if (!limits.cgroup) {
    limits.rlimit = MemoryRlimit::kData;
  }
  return limits;
}

// Said at start where the workers get no memory cgroup: why, and what holds them instead.
std::string WithoutCgroups(const WorkerRunnerOptions& options) {
  return absl::StrCat("memory-cgroup: none for the workers (", options.memory_cgroup.status().message(),
                      "): a CPU worker's memory is held by RLIMIT_AS alone, a GPU worker's by RLIMIT_DATA (its "
                      "private memory: not the page cache, nor what the NVIDIA driver maps for it)");
}

}  // namespace

const absl::StatusOr<sandbox::CgroupParent>& WorkerCgroupParent() {
  static const absl::StatusOr<sandbox::CgroupParent>* const parent =
      new absl::StatusOr<sandbox::CgroupParent>(sandbox::FindCgroupParent());
  return *parent;
}

std::vector<std::string> WorkerArguments(const WorkerRunnerOptions& options, const wire::Task& task,
                                         const std::string& scratch, const std::string& memory_cgroup) {
  std::vector<std::string> args = {options.binary, "--scratch=" + scratch};
  // A job's worker reads its tenant's roots only; other tasks (inspection, probes) the
  // server's configured ones. Roots in a bucket are read through the runner, not opened.
  std::vector<std::string> read_paths;
  for (const std::string& root : task.has_recalibrate() ? std::vector<std::string>(
                                                              task.recalibrate().data_roots().begin(),
                                                              task.recalibrate().data_roots().end())
                                                        : options.data_roots) {
    if (!data::IsS3Path(root)) read_paths.push_back(root);
  }
  if (!read_paths.empty()) args.push_back("--read_path=" + absl::StrJoin(read_paths, ","));
  const WorkerLimits limits = LimitsOf(options, task);
  if (OnGpu(task)) args.push_back("--gpu");
  if (limits.rlimit == MemoryRlimit::kAddressSpace) args.push_back(absl::StrCat("--memory_bytes=", limits.memory_bytes));
  if (limits.rlimit == MemoryRlimit::kData) args.push_back(absl::StrCat("--data_bytes=", limits.memory_bytes));
  if (!memory_cgroup.empty()) args.push_back("--memory_cgroup=" + memory_cgroup);
  if (options.file_bytes > 0) args.push_back(absl::StrCat("--file_bytes=", options.file_bytes));
  if (!options.user.empty()) args.push_back("--user=" + options.user);
  args.push_back(absl::StrCat("--server_pid=", ::getpid()));
  return args;
}

WorkerRunner::WorkerRunner(WorkerRunnerOptions options) : options_(std::move(options)) {
  // Writing to a worker that died must be an error, not the end of the server.
  ::signal(SIGPIPE, SIG_IGN);
}

wire::Task WorkerRunner::NewTask() const {
  wire::Task task;
  for (const std::string& op : options_.extra_allowed_ops) task.mutable_graph_policy()->add_extra_allowed_ops(op);
  task.mutable_graph_policy()->set_max_graph_nodes(options_.max_graph_nodes);
  return task;
}

absl::StatusOr<wire::Event> WorkerRunner::Run(const wire::Task& task, const std::string& model_path,
                                             const std::string& scratch, const RunHooks& hooks,
                                             wire::Sandboxed* sandboxed, const data::LocatedObjects* remote) {
  const WorkerLimits limits = LimitsOf(options_, task);
  // Made before the worker and removed after it was waited for (destroyed in that order).
  RECAL_ASSIGN_OR_RETURN(std::unique_ptr<sandbox::MemoryCgroup> cgroup, MemoryCgroupFor(limits));
  RECAL_ASSIGN_OR_RETURN(WorkerPipes pipes, WorkerPipes::Open(model_path));
  RECAL_ASSIGN_OR_RETURN(std::unique_ptr<WorkerProcess> process,
                         WorkerProcess::Spawn(WorkerArguments(options_, task, scratch, cgroup ? cgroup->dir() : ""),
                                              pipes.ChildDescriptors()));
  pipes.CloseChildEnds();
  WorkerWatchdog watchdog(*process, hooks.cancel, hooks.deadline, options_.kill_grace);
  StderrTail err(std::move(pipes.err_read));
  WorkerInput input(std::move(pipes.task_write));
  // Closing stdin says nothing more comes, unless replies to reads still may.
  TaskFeeder feeder(input, task, hooks, /*close_when_fed=*/remote == nullptr);
  std::optional<RemoteReads> reads;
  if (remote != nullptr) {
    reads.emplace(options_.object_storage, *remote, [&input](const wire::ReadReply& reply) { return input.Write(reply); });
  }
  WorkerEvents events = PumpEvents(pipes.events_read.get(),
                                   {.on_sandboxed =
                                        [&](const wire::Sandboxed& described) {
                                          if (sandboxed) *sandboxed = described;
                                          if (OnGpu(task)) LogGpuSandbox(described);
                                        },
                                    .on_progress = hooks.on_progress,
                                    .reads = reads ? &*reads : nullptr});
  const bool killed_for_protocol = !events.protocol.ok() && process->KillIfRunning();
  const int status = process->Wait();
  if (reads) reads->Stop();
  watchdog.Join();
  const std::string last_words = err.LastWords();
  const absl::Status feed_error = feeder.Finish();
  const int64_t oom_kills = cgroup ? cgroup->OomKills() : 0;
  if (cgroup) {
    if (absl::Status removed = cgroup->Remove(); !removed.ok()) log::Warning(std::string(removed.message()));
  }
  return RunOutcome(watchdog.stopped_by(), feed_error, std::move(events), status, killed_for_protocol, last_words,
                    limits, oom_kills);
}

absl::StatusOr<std::unique_ptr<sandbox::MemoryCgroup>> WorkerRunner::MemoryCgroupFor(const WorkerLimits& limits) const {
  if (!limits.cgroup) return nullptr;
  absl::StatusOr<std::unique_ptr<sandbox::MemoryCgroup>> cgroup =
      sandbox::MemoryCgroup::Create(*options_.memory_cgroup, limits.memory_bytes);
  if (!cgroup.ok()) {
    return absl::InternalError(absl::StrCat("cannot make the worker's memory cgroup (", limits.memory_flag,
                                            "): ", cgroup.status().message()));
  }
  return cgroup;
}

void WorkerRunner::LogGpuSandbox(const wire::Sandboxed& sandboxed) {
  // The server describes its sandbox once at start, with a CPU worker; a GPU worker's
  // differs (the NVIDIA devices admitted, no RLIMIT_AS, RLIMIT_DATA where it has no memory
  // cgroup): said once, at its first job.
  std::call_once(gpu_sandbox_logged_, [&] {
    log::Info("recal-server: GPU jobs run in sandboxed workers",
              {{"enforced", absl::StrJoin(sandboxed.enforced(), ", ")},
               {"not_enforced", absl::StrJoin(sandboxed.missing(), ", ")}});
  });
}

absl::StatusOr<wire::Event> WorkerRunner::RunInScratch(const wire::Task& task, const std::string& model_path,
                                                      const RunHooks& hooks, wire::Sandboxed* sandboxed) {
  const fs::path scratch = fs::path(options_.scratch_root) /
                           absl::StrFormat("worker-%016x", absl::Uniform<uint64_t>(absl::BitGen()));
  std::error_code error;
  fs::create_directories(scratch, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", scratch.string(), ": ", error.message()));
  absl::Cleanup remove = [&scratch] {
    std::error_code ignored;
    fs::remove_all(scratch, ignored);
  };
  if (absl::Status owned = GiveToWorkerUser(scratch.string()); !owned.ok()) return owned;
  return Run(task, model_path, scratch.string(), hooks, sandboxed);
}

absl::Status WorkerRunner::GiveToWorkerUser(const std::string& dir) const {
  if (options_.user.empty()) return absl::OkStatus();
  struct passwd* user = ::getpwnam(options_.user.c_str());
  if (user == nullptr) return absl::InvalidArgumentError(absl::StrCat("no user ", options_.user));
  if (::chown(dir.c_str(), user->pw_uid, user->pw_gid) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot give ", dir, " to ", options_.user));
  }
  return absl::OkStatus();
}

// The worker is told what there is and asks for ranges of it.
absl::StatusOr<std::optional<data::LocatedObjects>> WorkerRunner::LocateRemoteData(const RecalibrationTask& task) const {
  const std::optional<data::DataSpec> spec = data::DataSpecOfSource(task.plan.data());
  if (!spec || !data::ReadsObjectStorage(*spec)) return std::nullopt;
  // No roots would mean no confinement to the data layer (recal-run's case), never here.
  if (task.data_roots.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(spec->path, ": the tenant has no data roots"));
  }
  RECAL_ASSIGN_OR_RETURN(data::LocatedObjects located,
                         data::LocateObjects(*spec, {.data_roots = task.data_roots,
                                                     .object_storage = options_.object_storage}));
  return located;
}

absl::StatusOr<v1::RunReport> WorkerRunner::Recalibrate(const RecalibrationTask& task, const RunHooks& hooks) {
  wire::Task request = NewTask();
  wire::Recalibrate* job = request.mutable_recalibrate();
  *job->mutable_plan() = task.plan;
  job->set_device(task.device);
  job->set_threads(options_.threads);
  job->set_prefetch_depth(options_.prefetch_depth);
  job->set_decode_threads(options_.decode_threads);
  for (const std::string& root : task.data_roots) job->add_data_roots(root);
  job->set_shard_index(task.shard_index);
  job->set_shard_count(task.shard_count);
  for (const std::string& name : task.merge_statistics) job->add_merge(name);
  std::optional<data::LocatedObjects> remote;
  if (task.merge_statistics.empty()) {
    RECAL_ASSIGN_OR_RETURN(remote, LocateRemoteData(task));
    if (remote) *job->mutable_remote_objects() = RemoteObjectsOf(*remote);
  }
  if (absl::Status owned = GiveToWorkerUser(task.scratch_dir); !owned.ok()) return owned;
  auto event = Expect(Run(request, task.model_path, task.scratch_dir, hooks, nullptr, remote ? &*remote : nullptr),
                      wire::Event::kReport);
  if (!event.ok()) return event.status();
  return event->report();
}

// Room on this host: a slot of its inspections, held until the worker is gone (what bounds
// inspections on this host is the workers that exist, whoever asked for them).
class WorkerRunner::HostRoom final : public ModelInspector::Room {
 public:
  HostRoom(WorkerRunner* runner, InspectionSlots::Slot slot) : runner_(runner), slot_(std::move(slot)) {}
  absl::StatusOr<v1::Model> Inspect(const std::string& model_path) override {
    return runner_->InspectInRoom(model_path);
  }

 private:
  WorkerRunner* const runner_;
  InspectionSlots::Slot slot_;
};

absl::StatusOr<v1::Model> WorkerRunner::Inspect(const std::string& model_path) {
  RECAL_ASSIGN_OR_RETURN(std::unique_ptr<Room> room, Reserve(0));
  return room->Inspect(model_path);
}

absl::StatusOr<std::unique_ptr<ModelInspector::Room>> WorkerRunner::Reserve(int64_t /*archive_bytes*/) {
  InspectionSlots::Slot slot;
  if (options_.inspections != nullptr) {
    RECAL_ASSIGN_OR_RETURN(slot, options_.inspections->Acquire("", InspectionMemoryBytes(options_)));
  }
  return std::make_unique<HostRoom>(this, std::move(slot));
}

absl::StatusOr<v1::Model> WorkerRunner::InspectInRoom(const std::string& model_path) {
  wire::Task request = NewTask();
  request.mutable_inspect();
  RunHooks hooks;
  hooks.deadline = absl::Now() + options_.inspect_timeout;
  auto event = Expect(RunInScratch(request, model_path, hooks), wire::Event::kLayers);
  if (!event.ok()) return event.status();
  v1::Model model;
  *model.mutable_layers() = event->layers().layers();
  *model.mutable_inputs() = event->layers().inputs();
  return model;
}

absl::StatusOr<wire::Sandboxed> WorkerRunner::CheckWorker() {
  wire::Task task = NewTask();
  task.mutable_self_check();
  wire::Sandboxed sandboxed;
  const absl::Status checked = SelfCheck(task, &sandboxed);
  const WorkerLimits limits = LimitsOf(options_, task);
  if (!checked.ok() && limits.memory_bytes > 0) {
    // Whether the limit is the cause: a worker without it, asked the same.
    WorkerRunnerOptions unlimited = options_;
    unlimited.memory_bytes = unlimited.inspection_memory_bytes = 0;
    if (WorkerRunner(unlimited).SelfCheck(task, nullptr).ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a worker cannot run LibTorch under a memory limit of ", limits.memory_bytes, " bytes (", limits.memory_flag,
          "), held by ", HeldBy(limits), ", though it can without that limit: raise ", limits.memory_flag,
          limits.rlimit == MemoryRlimit::kAddressSpace
              ? " (LibTorch alone takes about 3 GiB of address space, more with more threads)"
              : "",
          ". Under the limit: ", checked.message()));
    }
  }
  RECAL_RETURN_IF_ERROR(checked);
  if (sandboxed.enforced().empty()) return absl::InternalError("the worker did not describe its sandbox");
  const bool capped = options_.memory_bytes > 0 || options_.inspection_memory_bytes > 0;
  if (capped && !options_.memory_cgroup.ok()) sandboxed.add_missing(WithoutCgroups(options_));
  return sandboxed;
}

absl::Status WorkerRunner::SelfCheck(const wire::Task& task, wire::Sandboxed* sandboxed) {
  RunHooks hooks;
  hooks.deadline = absl::Now() + absl::Minutes(1);
  return Expect(RunInScratch(task, "", hooks, sandboxed), wire::Event::kSelfChecked).status();
}

absl::StatusOr<wire::ProbeResult> WorkerRunner::Probe(const wire::SandboxProbe& probe) {
  wire::Task request = NewTask();
  *request.mutable_sandbox_probe() = probe;
  RunHooks hooks;
  hooks.deadline = absl::Now() + absl::Minutes(1);
  auto event = Expect(RunInScratch(request, "", hooks), wire::Event::kProbe);
  if (!event.ok()) return event.status();
  return event->probe();
}

}  // namespace recal::jobs
