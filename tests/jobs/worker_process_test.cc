// A worker process from the outside, with /bin/sh standing in for recal-worker: its end put
// into words, a hung one killed at its deadline, and the watchdog's SIGTERM, then SIGKILL
// for a worker that ignores it.
#include "server/jobs/worker_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace recal::jobs {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<WorkerProcess> StartShell(const std::string& script) {
  auto process = WorkerProcess::Spawn({"/bin/sh", "-c", script}, {-1, -1, -1});
  EXPECT_TRUE(process.ok()) << process.status();
  return process.ok() ? *std::move(process) : nullptr;
}

TEST(WorkerProcess, AnExitCodeIsSaidWithTheLastWords) {
  auto process = StartShell("exit 3");
  ASSERT_NE(process, nullptr);
  const int status = process->Wait();
  EXPECT_TRUE(process->finished());
  EXPECT_FALSE(ExitedCleanly(status));
  EXPECT_EQ(HowItEnded(status), "exited with code 3");
  const absl::Status failure = WorkerFailure(status, "no data", {});
  EXPECT_EQ(failure.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(failure.message(), "the worker exited with code 3: no data");
}

TEST(WorkerProcess, ASignalIsSaidWithItsLikelyCause) {
  auto process = StartShell("ulimit -c 0; kill -SEGV $$");
  ASSERT_NE(process, nullptr);
  const int status = process->Wait();
  EXPECT_EQ(HowItEnded(status), "was killed by SIGSEGV (Segmentation fault)");
  EXPECT_EQ(WorkerFailure(status, "", {}).message(),
            "the worker running the model was killed by SIGSEGV (Segmentation fault): LibTorch crashed on this model");
  EXPECT_THAT(WorkerFailure(status, "bad op", {}).message(), HasSubstr("(last words: bad op)"));
  // Under an address-space limit, a refused allocation may end as a crash: the limit and its
  // flag are named with the fix.
  WorkerLimits limits{.file_bytes = 0, .memory_bytes = 1 << 30, .memory_flag = "--inspection_memory_bytes",
                      .rlimit = MemoryRlimit::kAddressSpace};
  EXPECT_THAT(WorkerFailure(status, "", limits).message(),
              HasSubstr("LibTorch crashed on this model, or an allocation failed under the worker's address-space "
                        "limit of 1073741824 bytes (--inspection_memory_bytes; raise it for a large model)"));
  // A GPU worker without a memory cgroup is held by RLIMIT_DATA: named as such.
  limits.rlimit = MemoryRlimit::kData;
  limits.memory_flag = "--job_memory_bytes";
  EXPECT_THAT(WorkerFailure(status, "", limits).message(),
              HasSubstr("or an allocation failed under the worker's private-memory limit of 1073741824 bytes "
                        "(RLIMIT_DATA, --job_memory_bytes; raise it for a large model)"));
}

// SIGKILL: at the worker's own memory cgroup limit when the kernel counted an out-of-memory
// kill there (the limit and its flag named, with the fix), else from outside.
TEST(WorkerProcess, ASigkillIsTheCgroupsLimitOnlyWhereTheKernelCountedIt) {
  auto process = StartShell("kill -KILL $$");
  ASSERT_NE(process, nullptr);
  const int status = process->Wait();
  const WorkerLimits limits{.memory_bytes = int64_t{3} << 30, .memory_flag = "--job_memory_bytes", .cgroup = true};
  EXPECT_EQ(WorkerFailure(status, "", limits, /*cgroup_oom_kills=*/1).message(),
            "the worker running the model was killed by SIGKILL (Killed): it exceeded its memory limit of 3221225472 "
            "bytes (--job_memory_bytes) and the kernel stopped it there (its cgroup's out-of-memory killer). Raise "
            "--job_memory_bytes for this model, or run it with a smaller batch_size");
  EXPECT_THAT(WorkerFailure(status, "", limits, 0).message(),
              HasSubstr("SIGKILL (Killed) from outside, not at its own memory limit"));
  EXPECT_THAT(WorkerFailure(status, "", {}).message(),
              HasSubstr("from outside: the kernel's out-of-memory killer, most likely"));
}

TEST(WorkerProcess, KillIfRunningKillsOnlyAProcessThatHasNotEnded) {
  auto sleeping = StartShell("exec sleep 30");
  ASSERT_NE(sleeping, nullptr);
  EXPECT_TRUE(sleeping->KillIfRunning());
  const int killed = sleeping->Wait();
  EXPECT_EQ(HowItEnded(killed), "was killed by SIGKILL (Killed)");

  // Ended (its output closed, then a moment to become a zombie) but not yet waited for: not
  // killed, and its status is still its own.
  Fd out_read, out_write;
  ASSERT_TRUE(Pipe(out_read, out_write).ok());
  auto spawned = WorkerProcess::Spawn({"/bin/sh", "-c", "exit 4"}, {-1, out_write.get(), -1});
  ASSERT_TRUE(spawned.ok()) << spawned.status();
  std::unique_ptr<WorkerProcess> ended = *std::move(spawned);
  out_write.reset();
  char byte;
  while (::read(out_read.get(), &byte, 1) > 0) {
  }
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(ended->KillIfRunning());
  EXPECT_EQ(HowItEnded(ended->Wait()), "exited with code 4");
}

TEST(WorkerProcess, ACleanExitIsClean) {
  auto process = StartShell("exit 0");
  ASSERT_NE(process, nullptr);
  EXPECT_TRUE(ExitedCleanly(process->Wait()));
}

TEST(WorkerProcess, OneThatCannotStartIsAnErrorNamingTheBinary) {
  auto process = WorkerProcess::Spawn({"/no/such/recal-worker"}, {-1, -1, -1});
  ASSERT_FALSE(process.ok());
  EXPECT_EQ(process.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(process.status().message(), HasSubstr("cannot start /no/such/recal-worker"));
}

TEST(WorkerProcess, AHungOneIsKilledAtTheDeadline) {
  auto process = StartShell("exec sleep 30");
  ASSERT_NE(process, nullptr);
  EXPECT_FALSE(process->WaitUntil(absl::Now() + absl::Milliseconds(100)));
  EXPECT_TRUE(WIFSIGNALED(process->wait_status()));
  EXPECT_EQ(WTERMSIG(process->wait_status()), SIGKILL);

  auto quick = StartShell("exit 0");
  ASSERT_NE(quick, nullptr);
  EXPECT_TRUE(quick->WaitUntil(absl::Now() + absl::Seconds(30)));
  EXPECT_TRUE(ExitedCleanly(quick->wait_status()));
}

TEST(WorkerWatchdog, TheDeadlineEndsTheWorkerWithSigterm) {
  auto process = StartShell("exec sleep 30");
  ASSERT_NE(process, nullptr);
  WorkerWatchdog watchdog(*process, nullptr, absl::Now() + absl::Milliseconds(50), absl::Seconds(30));
  const int status = process->Wait();
  watchdog.Join();
  EXPECT_EQ(watchdog.stopped_by(), WorkerWatchdog::Stop::kPastDeadline);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

TEST(WorkerWatchdog, CancellingKillsAWorkerThatIgnoresSigtermAfterTheGrace) {
  // Cancelled only once it ignores SIGTERM (it says so on stdout).
  Fd ready_read, ready_write;
  ASSERT_TRUE(Pipe(ready_read, ready_write).ok());
  auto spawned = WorkerProcess::Spawn({"/bin/sh", "-c", "trap '' TERM; echo ready; exec sleep 30"},
                                      {-1, ready_write.get(), -1});
  ASSERT_TRUE(spawned.ok()) << spawned.status();
  std::unique_ptr<WorkerProcess> process = *std::move(spawned);
  ready_write.reset();
  char byte = 0;
  ASSERT_EQ(::read(ready_read.get(), &byte, 1), 1);
  std::atomic<bool> cancel{true};
  WorkerWatchdog watchdog(*process, &cancel, absl::InfiniteFuture(), absl::Milliseconds(200));
  const int status = process->Wait();
  watchdog.Join();
  EXPECT_EQ(watchdog.stopped_by(), WorkerWatchdog::Stop::kCancelled);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
}

TEST(WorkerWatchdog, AWorkerThatEndsByItselfIsNotStopped) {
  auto process = StartShell("exit 0");
  ASSERT_NE(process, nullptr);
  WorkerWatchdog watchdog(*process, nullptr, absl::InfiniteFuture(), absl::Seconds(2));
  EXPECT_TRUE(ExitedCleanly(process->Wait()));
  watchdog.Join();
  EXPECT_EQ(watchdog.stopped_by(), WorkerWatchdog::Stop::kNotStopped);
}

}  // namespace
}  // namespace recal::jobs
