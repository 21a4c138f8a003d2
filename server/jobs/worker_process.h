// One recal-worker process seen from the server, from its start to its exit status: started
// as every worker is (its own environment, default signals, only the descriptors it is
// given), signalled through a pidfd, waited for, and its end put into words. The watchdog
// beside it ends a worker from outside, on cancellation or at the deadline. What flows
// through its pipes is worker_pipes.h's.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/jobs/fd.h"

namespace recal::jobs {

class WorkerProcess {
 public:
  // Starts `args` (args[0]: the binary) with descriptors[i] as its descriptor i (a negative
  // one: /dev/null, for reading) and nothing else of the server's (the metadata DB, sockets,
  // blobs). INTERNAL naming the binary if it cannot start.
  static absl::StatusOr<std::unique_ptr<WorkerProcess>> Spawn(std::vector<std::string> args,
                                                              const std::vector<int>& descriptors);
  // A process not waited for yet is killed and waited for: no zombie is left behind.
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // Never reaches another process that reused the pid. Thread-safe.
  void Signal(int signal);
  // SIGKILL if it has not ended yet (not waited for: its status stays to be read); whether
  // it was still running, so that its end is known to be this kill's.
  bool KillIfRunning();
  // Blocks until it ends; its wait status.
  int Wait();
  // Waits until `deadline`, then kills it: false if it had to be killed. A process that
  // closed its output but hangs must not hang its caller.
  bool WaitUntil(absl::Time deadline);
  // Whether it was waited for (its pid may be another process's now). Thread-safe.
  bool finished() const { return finished_.load(); }
  int wait_status() const { return wait_status_; }

 private:
  WorkerProcess(pid_t pid, Fd pidfd) : pid_(pid), pidfd_(std::move(pidfd)) {}

  const pid_t pid_;
  const Fd pidfd_;  // -1 on kernels before 5.3
  std::atomic<bool> finished_{false};
  int wait_status_ = 0;
};

// "was killed by SIGSEGV (Segmentation fault)" or "exited with code 2".
std::string HowItEnded(int wait_status);
bool ExitedCleanly(int wait_status);

// Which rlimit holds a worker's memory cap, if one does: RLIMIT_AS on a CPU worker, RLIMIT_DATA
// on a GPU worker without a memory cgroup (server/sandbox/sandbox.h).
enum class MemoryRlimit { kNone, kAddressSpace, kData };

// The limits a worker ran under, to explain its end (0: none).
struct WorkerLimits {
  int64_t file_bytes = 0;         // RLIMIT_FSIZE
  int64_t memory_bytes = 0;       // its memory cap
  std::string memory_flag;        // the server flag that sets it, e.g. "--job_memory_bytes"
  MemoryRlimit rlimit = MemoryRlimit::kNone;
  bool cgroup = false;            // its memory cgroup holds the cap too
};

// INTERNAL: how a worker that ran a model ended, from its wait status (not a clean exit),
// with the likely cause of a signal (its memory cgroup's limit, where the kernel counted
// `cgroup_oom_kills`; the out-of-memory killer; the file size limit; a crash in LibTorch or
// an allocation refused under a memory rlimit) and its `last_words` on stderr.
absl::Status WorkerFailure(int wait_status, absl::string_view last_words, const WorkerLimits& limits,
                           int64_t cgroup_oom_kills = 0);

// Ends a worker once `*cancel` is set or `deadline` passes: SIGTERM, then SIGKILL after
// `grace`. Watches from its own thread until the worker was waited for; Join() after that.
class WorkerWatchdog {
 public:
  enum class Stop { kNotStopped, kCancelled, kPastDeadline };

  // `cancel` may be null; it and `process` must outlive the watchdog.
  WorkerWatchdog(WorkerProcess& process, const std::atomic<bool>* cancel, absl::Time deadline,
                 absl::Duration grace);
  ~WorkerWatchdog() { Join(); }
  WorkerWatchdog(const WorkerWatchdog&) = delete;
  WorkerWatchdog& operator=(const WorkerWatchdog&) = delete;

  void Join();
  // Why it stopped the worker, if it did (read after Join()).
  Stop stopped_by() const { return stopped_by_.load(); }

 private:
  void Watch(const std::atomic<bool>* cancel, absl::Time deadline, absl::Duration grace);

  WorkerProcess& process_;
  std::atomic<Stop> stopped_by_{Stop::kNotStopped};
  std::thread thread_;
};

}  // namespace recal::jobs
