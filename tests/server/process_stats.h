// What /proc says about the processes a test or bench starts: a process's threads and
// resident memory, its children by program, and the host's available memory. Read the
// moment they are called (Linux only).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace recal::testing {

// /proc/PID/status's Threads and VmRSS (bytes); -1 when the process is gone.
int ThreadsOf(pid_t pid);
int64_t ResidentBytesOf(pid_t pid);

// Children of `parent` (not deeper) whose argv[0] ends in "/`program`" or is `program`. A
// child between fork and exec still shows its parent's argv[0] and is not counted.
int CountChildren(pid_t parent, const std::string& program);

// /proc/meminfo's MemAvailable in bytes (-1 if unreadable).
int64_t MemAvailableBytes();

// Calls `sample` every `period` on a thread of its own, from construction until Stop().
class PeriodicSampler {
 public:
  PeriodicSampler(std::chrono::milliseconds period, std::function<void()> sample);
  ~PeriodicSampler() { Stop(); }
  PeriodicSampler(const PeriodicSampler&) = delete;
  PeriodicSampler& operator=(const PeriodicSampler&) = delete;
  void Stop();

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace recal::testing
