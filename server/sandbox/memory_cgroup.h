// A cgroup per worker process, whose memory limit the kernel holds against what the process
// uses (its anonymous memory, the page cache and kernel memory charged to it), not against
// its address space. It is how a GPU worker's host memory is bounded: CUDA reserves
// terabytes of address space, so no RLIMIT_AS a job could live with lets it start. A CPU
// worker gets one too, beside its RLIMIT_AS.
//
// The server makes one group per worker under a parent found once at start (FindCgroupParent)
// and removes it when the worker is gone (MemoryCgroup); the worker moves itself into its
// group before it enters the sandbox (JoinMemoryCgroup), so nothing of the model runs
// outside it, and the kernel's verdict is read back from the group (OomKills).
//
// cgroup v2 is preferred; the v1 memory hierarchy serves hosts that mount it (hybrid layouts,
// older container hosts). docs/security.md says which applies where.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace recal::sandbox {

// The files that say where this process's cgroups are; tests point them at a made-up tree.
struct CgroupFiles {
  std::string self_cgroup = "/proc/self/cgroup";
  std::string mountinfo = "/proc/self/mountinfo";
};

enum class CgroupVersion { kV1, kV2 };

// A directory in which a group with a memory limit can be made for each worker.
struct CgroupParent {
  std::string dir;
  CgroupVersion version = CgroupVersion::kV2;
};

// "cgroup v2" or "cgroup v1".
std::string VersionName(CgroupVersion version);

// The name of the leaf this process moves into in cgroup v2 (below).
inline constexpr char kServerLeaf[] = "recal-server";

// The group under which this process's workers get theirs: its own cgroup.
//   v2: its own group S, where S offers the memory controller. A v2 group with processes
//       cannot give its children a controller, so a process alone in S moves itself into
//       S/recal-server first and then enables memory for S's children; one that shares S
//       with others (a login shell, ctest, other services) cannot, and gets none.
//   v1: its own group in the memory hierarchy, where v2 has no memory controller: v1 lets
//       a group hold processes and children alike.
// Groups left behind by a server that died (empty recal-worker-<its pid>-*) are removed. A
// probe group is made and removed, so that a group that cannot be made or limited is said
// here.
// FAILED_PRECONDITION saying why none can be used and what would make one.
absl::StatusOr<CgroupParent> FindCgroupParent(const CgroupFiles& files = {});

// One worker's group under `parent` (recal-worker-<this process's pid>-<random>), limited to
// `max_bytes` of memory and no swap (where the kernel accounts swap), removed with Remove()
// or when destroyed.
class MemoryCgroup {
 public:
  // INTERNAL naming the file and errno when the group cannot be made or limited.
  static absl::StatusOr<std::unique_ptr<MemoryCgroup>> Create(const CgroupParent& parent, int64_t max_bytes);
  ~MemoryCgroup() { Remove().IgnoreError(); }
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  const std::string& dir() const { return dir_; }
  int64_t max_bytes() const { return max_bytes_; }
  // How many processes of the group the kernel's out-of-memory killer killed at its limit
  // (0 where the kernel does not count them).
  int64_t OomKills() const;
  // Removes the group once its processes are gone (waited for). Idempotent.
  absl::Status Remove();

 private:
  MemoryCgroup(std::string dir, CgroupVersion version, int64_t max_bytes)
      : dir_(std::move(dir)), version_(version), max_bytes_(max_bytes) {}

  std::string dir_;
  CgroupVersion version_;
  int64_t max_bytes_;
  bool removed_ = false;
};

// In the worker, before it drops its privileges: moves the calling process into the group
// at `dir`, checks that it is there, and describes the limit as the group's files state it,
// e.g. "memory-cgroup (v2): memory.max 3221225472 bytes, memory.swap.max 0 (DIR)".
// INTERNAL naming the file and errno when it cannot.
absl::StatusOr<std::string> JoinMemoryCgroup(const std::string& dir);

}  // namespace recal::sandbox
