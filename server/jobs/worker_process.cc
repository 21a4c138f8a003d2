#include "server/jobs/worker_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/sanitizers.h"

namespace recal::jobs {
namespace {

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

std::string SignalName(int signal) {
  const char* name = ::sigabbrev_np(signal);
  return absl::StrCat("SIG", name ? name : absl::StrCat(signal), " (", ::strsignal(signal), ")");
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::Spawn(std::vector<std::string> args,
                                                                     const std::vector<int>& descriptors) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  absl::Cleanup destroy_actions = [&actions] { posix_spawn_file_actions_destroy(&actions); };
  for (int child = 0; child < static_cast<int>(descriptors.size()); ++child) {
    if (descriptors[child] < 0) {
      posix_spawn_file_actions_addopen(&actions, child, "/dev/null", O_RDONLY, 0);
    } else {
      posix_spawn_file_actions_adddup2(&actions, descriptors[child], child);
    }
  }
  posix_spawn_file_actions_addclosefrom_np(&actions, static_cast<int>(descriptors.size()));
  std::vector<char*> argv = NullTerminated(args);
  std::vector<std::string> env = WorkerEnvironment();
  std::vector<char*> envp = NullTerminated(env);
  const WorkerSpawnAttributes attributes;
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, args[0].c_str(), &actions, attributes.get(), argv.data(), envp.data());
  if (spawned != 0) return absl::InternalError(absl::StrCat("cannot start ", args[0], ": ", std::strerror(spawned)));
  Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  return std::unique_ptr<WorkerProcess>(new WorkerProcess(pid, std::move(pidfd)));
}

WorkerProcess::~WorkerProcess() {
  if (finished()) return;
  Signal(SIGKILL);
  Wait();
}

void WorkerProcess::Signal(int signal) {
  if (pidfd_.get() >= 0) {
    ::syscall(SYS_pidfd_send_signal, pidfd_.get(), signal, nullptr, 0);
  } else if (!finished()) {  // kernels before 5.3
    ::kill(pid_, signal);
  }
}

bool WorkerProcess::KillIfRunning() {
  siginfo_t info{};
  // WNOWAIT: only a look; Wait() still reaps it and reads its status.
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != 0) {
    return false;
  }
  Signal(SIGKILL);
  return true;
}

int WorkerProcess::Wait() {
  while (::waitpid(pid_, &wait_status_, 0) < 0 && errno == EINTR) {
  }
  finished_ = true;
  return wait_status_;
}

bool WorkerProcess::WaitUntil(absl::Time deadline) {
  while (true) {
    const pid_t done = ::waitpid(pid_, &wait_status_, WNOHANG);
    if (done == pid_ || (done < 0 && errno != EINTR)) {
      finished_ = true;
      return true;
    }
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  Signal(SIGKILL);
  Wait();
  return false;
}

std::string HowItEnded(int wait_status) {
  return WIFSIGNALED(wait_status) ? absl::StrCat("was killed by ", SignalName(WTERMSIG(wait_status)))
                                  : absl::StrCat("exited with code ", WEXITSTATUS(wait_status));
}

bool ExitedCleanly(int wait_status) { return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0; }

namespace {

// Why a worker got SIGKILL: its own cgroup's limit when the kernel says so, else from outside.
std::string KilledBecause(const WorkerLimits& limits, int64_t cgroup_oom_kills) {
  if (cgroup_oom_kills > 0) {
    return absl::StrCat(": it exceeded its memory limit of ", limits.memory_bytes, " bytes (", limits.memory_flag,
                        ") and the kernel stopped it there (its cgroup's out-of-memory killer). Raise ",
                        limits.memory_flag, " for this model, or run it with a smaller batch_size");
  }
  if (limits.cgroup) return " from outside, not at its own memory limit: the host's out-of-memory killer, most likely";
  return " from outside: the kernel's out-of-memory killer, most likely";
}

// Under a memory rlimit a refused allocation is often not an error LibTorch reports but an
// abort or a crash in whatever did not expect it (loading a large archive, say).
std::string CrashedBecause(const WorkerLimits& limits) {
  std::string why = ": LibTorch crashed on this model";
  if (limits.memory_bytes <= 0 || limits.rlimit == MemoryRlimit::kNone) return why;
  const bool data = limits.rlimit == MemoryRlimit::kData;
  absl::StrAppend(&why, ", or an allocation failed under the worker's ", data ? "private-memory" : "address-space",
                  " limit of ", limits.memory_bytes, " bytes (", data ? "RLIMIT_DATA, " : "", limits.memory_flag,
                  "; raise it for a large model)");
  return why;
}

}  // namespace

absl::Status WorkerFailure(int wait_status, absl::string_view last_words, const WorkerLimits& limits,
                           int64_t cgroup_oom_kills) {
  if (!WIFSIGNALED(wait_status)) {
    return absl::InternalError(
        absl::StrCat("the worker ", HowItEnded(wait_status), last_words.empty() ? "" : ": ", last_words));
  }
  const int signal = WTERMSIG(wait_status);
  std::string message = absl::StrCat("the worker running the model ", HowItEnded(wait_status));
  if (signal == SIGKILL) {
    absl::StrAppend(&message, KilledBecause(limits, cgroup_oom_kills));
  } else if (signal == SIGXFSZ) {
    absl::StrAppend(&message, ": it wrote a file past the limit of ", limits.file_bytes, " bytes");
  } else if (signal == SIGSEGV || signal == SIGABRT || signal == SIGBUS || signal == SIGILL) {
    absl::StrAppend(&message, CrashedBecause(limits));
  }
  if (!last_words.empty()) absl::StrAppend(&message, " (last words: ", last_words, ")");
  return absl::InternalError(message);
}

WorkerWatchdog::WorkerWatchdog(WorkerProcess& process, const std::atomic<bool>* cancel, absl::Time deadline,
                               absl::Duration grace)
    : process_(process), thread_([this, cancel, deadline, grace] { Watch(cancel, deadline, grace); }) {}

void WorkerWatchdog::Join() {
  if (thread_.joinable()) thread_.join();
}

void WorkerWatchdog::Watch(const std::atomic<bool>* cancel, absl::Time deadline, absl::Duration grace) {
  while (!process_.finished()) {
    const bool cancelled = cancel != nullptr && cancel->load();
    if (cancelled || absl::Now() > deadline) {
      stopped_by_ = cancelled ? Stop::kCancelled : Stop::kPastDeadline;
      process_.Signal(SIGTERM);
      const absl::Time kill_at = absl::Now() + grace;
      while (!process_.finished() && absl::Now() < kill_at) absl::SleepFor(absl::Milliseconds(20));
      if (!process_.finished()) process_.Signal(SIGKILL);
      return;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace recal::jobs
