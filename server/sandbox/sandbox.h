// The walls around a process that runs an uploaded model (recal-worker): what Linux offers
// without privileges beyond those the server already has. Entered once, early, while the
// process is still single-threaded; irreversible.
//
//   network     its own network namespace (no interface but a down loopback), Landlock's
//               TCP rules where the kernel has them, and seccomp refusing every socket
//               family but AF_UNIX
//   files       Landlock: read only the system libraries, the paths the job names (model,
//               data roots, the directories of the libraries it loaded) and what LibTorch
//               reads about the CPU; read and write only the job's scratch directory (and,
//               on a GPU, the NVIDIA device files); no links, devices or executables made
//               anywhere
//   privileges  no_new_privs, every capability dropped, optionally another user
//   syscalls    seccomp: no execve, fork, ptrace, mount, module, keyring, bpf, io_uring,
//               namespace or clock calls; signals only to itself
//   resources   its memory cgroup where the server made one (memory_cgroup.h), RLIMIT_AS (not
//               on a GPU) or RLIMIT_DATA (a GPU worker without a cgroup), RLIMIT_FSIZE,
//               RLIMIT_NOFILE, no core dumps; killed with the server
//
// Whatever the kernel cannot enforce is reported by name (Enforcement::missing), never
// skipped silently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recal::sandbox {

struct Policy {
  std::vector<std::string> read_paths;   // files or directories, recursively
  std::vector<std::string> write_paths;  // directories the process may create files in
  int64_t memory_bytes = 0;              // RLIMIT_AS; 0: no limit
  // RLIMIT_DATA: the private writable memory the process maps (its heap, anonymous mappings,
  // thread stacks), which the kernel counts apart from its address space (mm/mmap.c,
  // is_data_mapping): CUDA's address-space reservations (PROT_NONE) and the NVIDIA driver's
  // shared mappings are not counted. A GPU worker's bound where it has no cgroup. 0: none.
  int64_t data_bytes = 0;
  // A cgroup the server made for this process (MemoryCgroup): joined first, while the process
  // may still move itself, so the model runs under its memory limit. Empty: none.
  std::string memory_cgroup;
  int64_t file_bytes = 0;                // RLIMIT_FSIZE; 0: no limit
  int64_t open_files = 1024;             // RLIMIT_NOFILE
  std::string user;                      // switch to this user (needs root); empty: stay
  // The server that started the process: if the parent is another by now (the server died
  // and the process was adopted), it stops. 0: stop if adopted by pid 1. Not "parent is pid
  // 1" alone: in a container without an init the server itself is pid 1.
  int64_t server_pid = 0;
  // A worker on a CUDA device. Landlock admits read, write and ioctl on the NVIDIA device
  // files that exist (NvidiaDeviceFiles) and read on what the driver reads about the GPU
  // (/proc/driver/nvidia, the PCI devices in /sys). No RLIMIT_AS whatever memory_bytes says:
  // CUDA reserves terabytes of address space for unified addressing, so any limit a job
  // could live with fails its context creation; said in Enforcement::missing. Its host
  // memory is its cgroup's to bound, else RLIMIT_DATA's (data_bytes). The driver's
  // libraries are the caller's to admit (LoadedLibraryDirs after loading libcuda.so.1).
  bool gpu = false;
};

struct Enforcement {
  std::vector<std::string> enforced;  // e.g. "landlock-fs (ABI 6)"
  std::vector<std::string> missing;   // e.g. "network-namespace: unshare: Operation not permitted"
};

// Applies `policy` to the calling process. Fails only when something that must hold cannot
// be set at all (rlimits, no_new_privs, seccomp); the rest is reported in `missing`.
absl::StatusOr<Enforcement> Enter(const Policy& policy);

// The NVIDIA device files of `dev` that exist: nvidiactl, nvidia0..N, nvidia-uvm,
// nvidia-uvm-tools and the nvidia-caps directory (MIG capabilities).
std::vector<std::string> NvidiaDeviceFiles(const std::string& dev = "/dev");

// The real paths of the shared libraries loaded in this process, and their directories
// (deduplicated, in load order): what the process loads later (LibTorch dlopens cuDNN's
// sub-libraries and NVRTC's builtins, the CUDA runtime the driver) lies beside them, and
// wherever that is (a venv, /usr/local/nvidia/lib64) it must stay readable in the sandbox.
std::vector<std::string> LoadedLibraries();
std::vector<std::string> LoadedLibraryDirs();

}  // namespace recal::sandbox
