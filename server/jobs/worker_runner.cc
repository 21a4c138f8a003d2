#include "server/jobs/worker_runner.h"

#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/message_lite.h"
#include "common/sanitizers.h"
#include "common/status_macros.h"
#include "common/data_spec.h"
#include "server/data_access/locate_objects.h"
#include "server/data_access/s3_paths.h"
#include "server/jobs/remote_reads.h"
#include "server/log/log.h"
#include "server/worker/channel.h"

extern char** environ;

namespace recal::jobs {
namespace {

namespace wire = worker::v1;
namespace fs = std::filesystem;

constexpr int64_t kMaxEventBytes = int64_t{64} << 20;
constexpr size_t kStderrTail = 4096;

absl::Status ErrnoStatus(absl::string_view what) {
  return absl::ErrnoToStatus(errno, what);
}

// A descriptor closed when it goes out of scope.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Above the descriptors the child gets (0-4), so that no dup2 in the child overwrites another
// source descriptor.
absl::StatusOr<Fd> High(int fd) {
  const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  ::close(fd);
  if (high < 0) return ErrnoStatus("fcntl(F_DUPFD_CLOEXEC)");
  return Fd(high);
}

absl::Status Pipe(Fd& read_end, Fd& write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoStatus("pipe2");
  auto r = High(fds[0]);
  auto w = High(fds[1]);
  if (!r.ok()) return r.status();
  if (!w.ok()) return w.status();
  read_end = *std::move(r);
  write_end = *std::move(w);
  return absl::OkStatus();
}

std::string SignalName(int signal) {
  const char* name = ::sigabbrev_np(signal);
  return absl::StrCat("SIG", name ? name : absl::StrCat(signal), " (", ::strsignal(signal), ")");
}

std::string LastLine(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const size_t cut = text.find_last_of('\n');
  return cut == std::string::npos ? text : text.substr(cut + 1);
}

// What a worker's environment holds: nothing of the server's (credentials, tokens) reaches
// the model, but what decides which libraries and devices it finds: the library path the
// server was started with (a LibTorch, a driver or their dependencies outside the system's
// directories), and which GPUs CUDA shows and in what order (cuda:N must name the same
// device in every worker, and the count --print_cuda_devices gives must be theirs), and how
// its OpenMP threads wait: spinning threads of several workers on a shared host (or of
// tests run side by side) take the cores the others compute on, so the operator's
// OMP_WAIT_POLICY=passive must reach them. A sanitizer build (tests only) passes the runtime's own options on (suppressions, leak
// checks, halt on error): the worker is checked as the server is.
std::vector<std::string> WorkerEnvironment() {
  std::vector<std::string> env = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8"};
  for (const char* name : {"LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "OMP_WAIT_POLICY",
                           "GOMP_SPINCOUNT"}) {
    if (const char* value = std::getenv(name)) env.push_back(absl::StrCat(name, "=", value));
  }
  if (kSanitizer != nullptr) {
    for (const char* name : {"ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS"}) {
      if (const char* value = std::getenv(name)) env.push_back(absl::StrCat(name, "=", value));
    }
  }
  return env;
}

// argv / envp for posix_spawn: pointers into `strings`, which must outlive them.
std::vector<char*> NullTerminated(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// posix_spawn attributes of a worker: the server blocks SIGTERM for its signal thread and
// ignores SIGPIPE; the worker must not.
class WorkerSpawnAttributes {
 public:
  WorkerSpawnAttributes() {
    posix_spawnattr_init(&attributes_);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    for (int signal : {SIGTERM, SIGINT, SIGPIPE, SIGHUP}) sigaddset(&defaults, signal);
    posix_spawnattr_setsigmask(&attributes_, &none);
    posix_spawnattr_setsigdefault(&attributes_, &defaults);
    posix_spawnattr_setflags(&attributes_, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  }
  ~WorkerSpawnAttributes() { posix_spawnattr_destroy(&attributes_); }
  WorkerSpawnAttributes(const WorkerSpawnAttributes&) = delete;
  WorkerSpawnAttributes& operator=(const WorkerSpawnAttributes&) = delete;
  const posix_spawnattr_t* get() const { return &attributes_; }

 private:
  posix_spawnattr_t attributes_;
};

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

// A worker started for one question (CountCudaDevices), its stdout and stderr on pipes.
struct Asked {
  pid_t pid = -1;
  Fd out;
  Fd err;
};

// Starts `args` as a worker is started (its environment, its signals), stdin from /dev/null
// and nothing else of the server's inherited.
absl::StatusOr<Asked> Ask(std::vector<std::string> args) {
  Fd out_write, err_write;
  Asked asked;
  if (absl::Status s = Pipe(asked.out, out_write); !s.ok()) return s;
  if (absl::Status s = Pipe(asked.err, err_write); !s.ok()) return s;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  absl::Cleanup destroy_actions = [&actions] { posix_spawn_file_actions_destroy(&actions); };
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_write.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, err_write.get(), 2);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  std::vector<char*> argv = NullTerminated(args);
  std::vector<std::string> env = WorkerEnvironment();
  std::vector<char*> envp = NullTerminated(env);
  const WorkerSpawnAttributes attributes;
  const int spawned = ::posix_spawn(&asked.pid, args[0].c_str(), &actions, attributes.get(), argv.data(), envp.data());
  if (spawned != 0) return absl::InternalError(absl::StrCat("cannot start ", args[0], ": ", std::strerror(spawned)));
  return asked;
}

// Reads what `asked` prints on stdout and stderr (the last kStderrTail bytes or more of
// each) until it closes both, or until `deadline`: false if the deadline came first.
absl::StatusOr<bool> ReadAnswer(const Asked& asked, absl::Time deadline, std::string* out, std::string* err) {
  pollfd fds[2] = {{asked.out.get(), POLLIN, 0}, {asked.err.get(), POLLIN, 0}};
  std::string* into[2] = {out, err};
  while (fds[0].fd >= 0 || fds[1].fd >= 0) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return false;
    if (::poll(fds, 2, static_cast<int>(std::min<int64_t>(left_ms, 1000))) < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("poll");
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t got = ::read(fds[i].fd, buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        fds[i].fd = -1;  // poll() skips negative descriptors
        continue;
      }
      into[i]->append(buffer, static_cast<size_t>(got));
      if (into[i]->size() > 2 * kStderrTail) into[i]->erase(0, into[i]->size() - kStderrTail);
    }
  }
  return true;
}

// Waits for `pid` until `deadline`, then kills it: false if it had to be killed. A
// process that closed its output but hangs must not hang the server's start.
bool Reap(pid_t pid, absl::Time deadline, int* status) {
  while (true) {
    const pid_t done = ::waitpid(pid, status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) return true;
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  ::kill(pid, SIGKILL);  // not reaped yet, so the pid is still this process's
  while (::waitpid(pid, status, 0) < 0 && errno == EINTR) {
  }
  return false;
}

// OK for a clean exit, else what happened to the worker asked `question`, with its last words.
absl::Status ExitOf(const std::string& question, int status, const std::string& err) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  const std::string why = LastLine(err);
  const std::string what = WIFSIGNALED(status) ? absl::StrCat("was killed by ", SignalName(WTERMSIG(status)))
                                               : absl::StrCat("exited with code ", WEXITSTATUS(status));
  return absl::InternalError(absl::StrCat(question, " ", what, why.empty() ? "" : ": ", why));
}

bool OnGpu(const wire::Task& task) {
  return task.has_recalibrate() && absl::StartsWith(task.recalibrate().device(), "cuda");
}

}  // namespace

namespace {

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
  absl::StatusOr<Asked> asked = Ask(args);
  if (!asked.ok()) return asked.status();
  const absl::Time deadline = absl::Now() + timeout;
  std::string out;
  CudaCount answer;
  absl::StatusOr<bool> answered = ReadAnswer(*asked, deadline, &out, &answer.err);
  int status = 0;
  const bool exited = Reap(asked->pid, answered.ok() ? deadline : absl::Now(), &status);
  if (!answered.ok()) return answered.status();
  if (!*answered || !exited) {
    return absl::DeadlineExceededError(absl::StrCat(question, " did not answer within ", absl::FormatDuration(timeout)));
  }
  if (absl::Status clean = ExitOf(question, status, answer.err); !clean.ok()) return clean;
  if (!absl::SimpleAtoi(out, &answer.count) || answer.count < 0) {
    return absl::InternalError(absl::StrCat(question, " printed '", absl::CHexEscape(LastLine(out)),
                                            "', not a number of devices"));
  }
  return answer;
}

}  // namespace

// Counted as LibTorch sees them, then inside the GPU sandbox a job gets: a sandbox that keeps
// the driver from something it needs (as the H200's first run found) is said at start, with
// the driver's answer, not at every job, and never taken for a machine without GPUs.
absl::StatusOr<int> CountCudaDevices(const std::string& binary, absl::Duration timeout) {
  RECAL_ASSIGN_OR_RETURN(const CudaCount plain, AskCudaDevices(binary, {}, timeout));
  if (plain.count == 0) return 0;
  RECAL_ASSIGN_OR_RETURN(const CudaCount sandboxed, AskCudaDevices(binary, {"--gpu"}, timeout));
  if (sandboxed.count < plain.count) {
    return absl::FailedPreconditionError(absl::StrCat(
        binary, " sees ", plain.count, " CUDA device(s), but ", sandboxed.count,
        " inside the GPU sandbox its jobs run in (", LastLine(sandboxed.err),
        "): the sandbox refuses the NVIDIA driver something it needs, so no GPU job could run. Report it "
        "with this message (docs/gpu.md), or run on --devices=cpu meanwhile"));
  }
  return plain.count;
}

int64_t InspectionMemoryBytes(const WorkerRunnerOptions& options) {
  return options.inspection_memory_bytes > 0 ? options.inspection_memory_bytes : options.memory_bytes;
}

std::vector<std::string> WorkerArguments(const WorkerRunnerOptions& options, const wire::Task& task,
                                         const std::string& scratch) {
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
  const int64_t memory_bytes = task.has_inspect() ? InspectionMemoryBytes(options) : options.memory_bytes;
  if (OnGpu(task)) {
    args.push_back("--gpu");
  } else if (memory_bytes > 0) {
    args.push_back(absl::StrCat("--memory_bytes=", memory_bytes));
  }
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
  Fd task_read, task_write, events_read, events_write, err_read, err_write, model;
  if (absl::Status s = Pipe(task_read, task_write); !s.ok()) return s;
  if (absl::Status s = Pipe(events_read, events_write); !s.ok()) return s;
  if (absl::Status s = Pipe(err_read, err_write); !s.ok()) return s;
  if (!model_path.empty()) {
    const int fd = ::open(model_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(absl::StrCat("cannot open the model ", model_path));
    auto high = High(fd);
    if (!high.ok()) return high.status();
    model = *std::move(high);
  }

  std::vector<std::string> args = WorkerArguments(options_, task, scratch);
  std::vector<char*> argv = NullTerminated(args);
  std::vector<std::string> env = WorkerEnvironment();
  std::vector<char*> envp = NullTerminated(env);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  absl::Cleanup destroy_actions = [&actions] { posix_spawn_file_actions_destroy(&actions); };
  posix_spawn_file_actions_adddup2(&actions, task_read.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, err_write.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, err_write.get(), 2);
  posix_spawn_file_actions_adddup2(&actions, events_write.get(), 3);
  if (model.get() >= 0) posix_spawn_file_actions_adddup2(&actions, model.get(), 4);
  // Nothing else of the server's (the metadata DB, sockets, blobs) is inherited.
  posix_spawn_file_actions_addclosefrom_np(&actions, model.get() >= 0 ? 5 : 4);
  const WorkerSpawnAttributes attributes;
  pid_t pid = -1;
  const int spawned =
      ::posix_spawn(&pid, options_.binary.c_str(), &actions, attributes.get(), argv.data(), envp.data());
  if (spawned != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", options_.binary, ": ", std::strerror(spawned)));
  }
  // Signals go through a pidfd: never to another process that reused the pid.
  Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  task_read.reset();
  events_write.reset();
  err_write.reset();
  model.reset();

  std::atomic<bool> finished{false};  // waited for: its pid may be another process's now
  const auto signal_worker = [&](int signal) {
    if (pidfd.get() >= 0) {
      ::syscall(SYS_pidfd_send_signal, pidfd.get(), signal, nullptr, 0);
    } else if (!finished.load()) {  // kernels before 5.3
      ::kill(pid, signal);
    }
  };
  std::atomic<int> stopped_by{0};  // 1: cancelled, 2: past the deadline
  std::thread watchdog([&] {
    while (!finished.load()) {
      const bool cancel = hooks.cancel != nullptr && hooks.cancel->load();
      const bool late = absl::Now() > hooks.deadline;
      if (cancel || late) {
        stopped_by = cancel ? 1 : 2;
        signal_worker(SIGTERM);
        const absl::Time kill_at = absl::Now() + options_.kill_grace;
        while (!finished.load() && absl::Now() < kill_at) absl::SleepFor(absl::Milliseconds(20));
        if (!finished.load()) signal_worker(SIGKILL);
        return;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  });
  std::string err_tail;
  std::thread err_reader([&] {
    char buffer[4096];
    while (true) {
      const ssize_t got = ::read(err_read.get(), buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      err_tail.append(buffer, static_cast<size_t>(got));
      if (err_tail.size() > 2 * kStderrTail) err_tail.erase(0, err_tail.size() - kStderrTail);
    }
  });
  // The worker's stdin: the task, then pushed batches (written by the feeder) or replies to
  // its reads (by the RemoteReads threads), one message at a time.
  std::mutex input_mu;
  Fd input(task_write.release());
  const auto write_input = [&](const google::protobuf::MessageLite& message) {
    std::lock_guard<std::mutex> lock(input_mu);
    if (input.get() < 0) return absl::FailedPreconditionError("the worker's input is closed");
    return worker::WriteMessage(input.get(), message);
  };
  // Why the feed stopped before the job ended (a client that stopped pushing): the job's
  // error, rather than the worker's view of it (its input ended early).
  absl::Status feed_error;
  std::atomic<bool> releasing_feed{false};
  std::thread feeder([&] {
    absl::Cleanup close_input = [&] {
      // Closing stdin says nothing more comes, unless replies to reads still may.
      std::lock_guard<std::mutex> lock(input_mu);
      if (remote == nullptr) input.reset();
    };
    if (!write_input(task).ok()) return;
    if (!hooks.next_pushed) return;
    while (true) {
      auto batch = hooks.next_pushed();
      if (!batch.ok() && !releasing_feed) feed_error = batch.status();
      if (!batch.ok() || !batch->has_value()) return;
      if (!write_input(**batch).ok()) return;
      if ((*batch)->last()) return;
    }
  });
  std::optional<RemoteReads> reads;
  if (remote != nullptr) {
    reads.emplace(options_.object_storage, *remote, [&](const wire::ReadReply& reply) { return write_input(reply); });
  }

  std::optional<wire::Event> last;
  absl::Status protocol;
  {
    worker::MessageReader events(events_read.get(), kMaxEventBytes);
    while (true) {
      wire::Event event;
      absl::StatusOr<bool> read = events.Read(&event);
      if (!read.ok()) {
        protocol = read.status();
        break;
      }
      if (!*read) break;
      switch (event.kind_case()) {
        case wire::Event::kSandboxed:
          if (sandboxed) *sandboxed = event.sandboxed();
          if (OnGpu(task)) LogGpuSandbox(event.sandboxed());
          break;
        case wire::Event::kProgress:
          if (hooks.on_progress && !last) hooks.on_progress(event.progress());
          break;
        case wire::Event::kReadRequest:
          if (!reads) {
            protocol = absl::InvalidArgumentError("it asked to read data in a bucket that its task does not have");
            break;
          }
          reads->Serve(event.read_request());
          break;
        default:
          if (!last) last = std::move(event);
      }
      if (!protocol.ok()) break;
    }
  }
  if (!protocol.ok()) signal_worker(SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  finished = true;
  if (reads) reads->Stop();
  watchdog.join();
  err_reader.join();
  // A feeder blocked in next_pushed() is released by the job's end (its feed is closed).
  releasing_feed = true;
  if (hooks.release_pushed) hooks.release_pushed();
  feeder.join();

  const std::string why = LastLine(err_tail);
  if (stopped_by == 1) return absl::CancelledError("cancelled");
  if (stopped_by == 2) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the job ran past its deadline; its worker was stopped"));
  }
  if (!feed_error.ok()) return feed_error;
  if (last && WIFEXITED(status) && WEXITSTATUS(status) == 0) return *std::move(last);
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    std::string message = absl::StrCat("the worker running the model was killed by ", SignalName(signal));
    if (signal == SIGKILL) {
      absl::StrAppend(&message, " from outside: the kernel's out-of-memory killer, most likely");
    } else if (signal == SIGXFSZ) {
      absl::StrAppend(&message, ": it wrote a file past the limit of ", options_.file_bytes, " bytes");
    } else if (signal == SIGSEGV || signal == SIGABRT || signal == SIGBUS || signal == SIGILL) {
      absl::StrAppend(&message, ": LibTorch crashed on this model");
    }
    if (!why.empty()) absl::StrAppend(&message, " (last words: ", why, ")");
    return absl::InternalError(message);
  }
  if (!protocol.ok()) return absl::InternalError(absl::StrCat("the worker broke the protocol: ", protocol.message()));
  return absl::InternalError(absl::StrCat("the worker exited with code ", WEXITSTATUS(status),
                                          why.empty() ? "" : ": ", why));
}

void WorkerRunner::LogGpuSandbox(const wire::Sandboxed& sandboxed) {
  // The server describes its sandbox once at start, with a CPU worker; a GPU worker's
  // differs (the NVIDIA devices admitted, no RLIMIT_AS): said once, at its first job.
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
    return ErrnoStatus(absl::StrCat("cannot give ", dir, " to ", options_.user));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RunReport> WorkerRunner::Recalibrate(const RecalibrationTask& task, const RunHooks& hooks) {
  wire::Task request = NewTask();
  wire::Recalibrate* job = request.mutable_recalibrate();
  *job->mutable_spec() = task.spec;
  job->set_data_spec(task.data_spec);
  job->set_device(task.device);
  job->set_threads(options_.threads);
  job->set_prefetch_depth(options_.prefetch_depth);
  job->set_decode_threads(options_.decode_threads);
  for (const std::string& root : task.data_roots) job->add_data_roots(root);
  job->set_shard_index(task.shard_index);
  job->set_shard_count(task.shard_count);
  for (const std::string& name : task.merge_statistics) job->add_merge(name);
  // Data in a bucket: found here, where the network and the credentials are, before the
  // worker starts; the worker is told what there is and asks for ranges of it.
  std::optional<data::LocatedObjects> remote;
  if (auto parsed = data::ParseDataSpec(task.data_spec);
      task.merge_statistics.empty() && parsed.ok() && data::ReadsObjectStorage(*parsed)) {
    // No roots would mean no confinement to the data layer (recal-run's case), never here.
    if (task.data_roots.empty()) {
      return absl::PermissionDeniedError(absl::StrCat(task.data_spec, ": the tenant has no data roots"));
    }
    auto located = data::LocateObjects(*parsed, {.data_roots = task.data_roots,
                                                 .object_storage = options_.object_storage});
    if (!located.ok()) return located.status();
    remote = *std::move(located);
    wire::RemoteObjects* objects = job->mutable_remote_objects();
    objects->set_bucket(remote->bucket);
    for (const s3::ObjectInfo& object : remote->objects) {
      wire::RemoteObject* out = objects->add_objects();
      out->set_key(object.key);
      out->set_size(object.size);
    }
  }
  if (absl::Status owned = GiveToWorkerUser(task.scratch_dir); !owned.ok()) return owned;
  auto event = Expect(Run(request, task.model_path, task.scratch_dir, hooks, nullptr, remote ? &*remote : nullptr),
                      wire::Event::kReport);
  if (!event.ok()) return event.status();
  return event->report();
}

absl::StatusOr<std::vector<v1::BatchNormLayer>> WorkerRunner::Inspect(const std::string& model_path) {
  // Held until the worker is gone: what bounds inspections on this host is the workers
  // that exist, whoever asked for them.
  InspectionSlots::Slot slot;
  if (options_.inspections != nullptr) {
    RECAL_ASSIGN_OR_RETURN(slot, options_.inspections->Acquire("", InspectionMemoryBytes(options_)));
  }
  wire::Task request = NewTask();
  request.mutable_inspect();
  RunHooks hooks;
  hooks.deadline = absl::Now() + options_.inspect_timeout;
  auto event = Expect(RunInScratch(request, model_path, hooks), wire::Event::kLayers);
  if (!event.ok()) return event.status();
  return std::vector<v1::BatchNormLayer>(event->layers().layers().begin(), event->layers().layers().end());
}

absl::StatusOr<wire::Sandboxed> WorkerRunner::DescribeSandbox() {
  RunHooks hooks;
  hooks.deadline = absl::Now() + absl::Minutes(1);
  wire::Sandboxed sandboxed;
  // An empty task: the worker enters the sandbox, says what holds, and refuses the task.
  auto event = RunInScratch(NewTask(), "", hooks, &sandboxed);
  if (!event.ok()) return event.status();
  if (sandboxed.enforced().empty()) return absl::InternalError("the worker did not describe its sandbox");
  return sandboxed;
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
