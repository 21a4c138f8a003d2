#include "server/sandbox/sandbox.h"

#include <fcntl.h>
#include <grp.h>
#include <link.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sanitizers.h"
#include "common/status_macros.h"
#include "server/sandbox/memory_cgroup.h"

namespace recal::sandbox {
namespace {

std::string Errno(absl::string_view what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

// ---------------------------------------------------------------- Landlock (linux/landlock.h)
// Spelled out here: Debian 12's kernel headers stop at ABI 2, the kernels it runs on go
// further, and the values are a stable kernel ABI.
constexpr uint64_t kFsExecute = 1ULL << 0, kFsWriteFile = 1ULL << 1, kFsReadFile = 1ULL << 2,
                   kFsReadDir = 1ULL << 3, kFsRemoveDir = 1ULL << 4, kFsRemoveFile = 1ULL << 5,
                   kFsMakeChar = 1ULL << 6, kFsMakeDir = 1ULL << 7, kFsMakeReg = 1ULL << 8,
                   kFsMakeSock = 1ULL << 9, kFsMakeFifo = 1ULL << 10, kFsMakeBlock = 1ULL << 11,
                   kFsMakeSym = 1ULL << 12, kFsRefer = 1ULL << 13, kFsTruncate = 1ULL << 14,
                   kFsIoctlDev = 1ULL << 15;
constexpr uint64_t kNetBindTcp = 1ULL << 0, kNetConnectTcp = 1ULL << 1;
constexpr uint64_t kScopeAbstractUnixSocket = 1ULL << 0, kScopeSignal = 1ULL << 1;
constexpr int kRulePathBeneath = 1;
constexpr uint32_t kCreateRulesetVersion = 1U << 0;

struct RulesetAttr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;  // ABI 4
  uint64_t scoped;              // ABI 6
};

struct __attribute__((packed)) PathBeneathAttr {
  uint64_t allowed_access;
  int32_t parent_fd;
};

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif

// Handled rights for an ABI: each version adds some; handling one the kernel does not know
// makes the ruleset invalid.
uint64_t HandledFs(int abi) {
  uint64_t fs = kFsExecute | kFsWriteFile | kFsReadFile | kFsReadDir | kFsRemoveDir | kFsRemoveFile |
                kFsMakeChar | kFsMakeDir | kFsMakeReg | kFsMakeSock | kFsMakeFifo | kFsMakeBlock |
                kFsMakeSym;
  if (abi >= 2) fs |= kFsRefer;
  if (abi >= 3) fs |= kFsTruncate;
  if (abi >= 5) fs |= kFsIoctlDev;
  return fs;
}

// Allows `access` beneath `path`; a path that does not exist is no error (nothing to allow).
absl::Status AllowBeneath(int ruleset, const std::string& path, uint64_t access, int abi) {
  const int fd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(Errno(absl::StrCat("landlock: open ", path)));
  }
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat info;
  if (::fstat(fd, &info) != 0) return absl::InternalError(Errno(absl::StrCat("landlock: stat ", path)));
  // Directory rights on a file are refused by the kernel.
  if (!S_ISDIR(info.st_mode)) access &= kFsExecute | kFsWriteFile | kFsReadFile | kFsTruncate | kFsIoctlDev;
  PathBeneathAttr rule{access & HandledFs(abi), fd};
  if (::syscall(SYS_landlock_add_rule, ruleset, kRulePathBeneath, &rule, 0) != 0) {
    return absl::InternalError(Errno(absl::StrCat("landlock: rule for ", path)));
  }
  return absl::OkStatus();
}

// What LibTorch and the C library read once the process runs: shared libraries loaded
// late, CPU topology (cpuinfo, OpenMP, oneDNN), the process's own /proc entries, entropy.
const std::vector<std::string> kSystemReadPaths = {
    "/usr/lib", "/lib", "/lib64", "/usr/share/zoneinfo", "/etc/ld.so.cache", "/proc/self",
    "/proc/cpuinfo", "/proc/meminfo", "/sys/devices/system/cpu", "/sys/devices/system/node",
    "/sys/fs/cgroup", "/dev/urandom", "/dev/random"};

// What the CUDA driver reads about the GPU besides its device files: its /proc entries
// (parameters, each GPU, MIG capabilities), the major numbers in /proc/devices, the PCI
// devices in /sys (NUMA node, resources: /sys/bus/pci/devices links into /sys/devices, and
// Landlock checks where a link leads) and the kernel modules' parameters.
const std::vector<std::string> kGpuReadPaths = {"/proc/driver/nvidia", "/proc/devices",     "/sys/devices",
                                                "/sys/bus/pci",        "/sys/module/nvidia", "/sys/module/nvidia_uvm",
                                                "/proc/sys/vm/mmap_min_addr"};

// The driver names the threads it starts from another thread, fopen(/proc/self/task/TID/comm,
// "w"): write and truncate (O_TRUNC). Without them cuInit fails with
// CUDA_ERROR_OPERATING_SYSTEM (found on an H200, driver 580). The worker's own threads,
// nothing of another process: /proc/self is resolved when the rule is made, to its /proc/PID.
const std::vector<std::string> kGpuWritePaths = {"/proc/self/task"};

constexpr uint64_t kRead = kFsReadFile | kFsReadDir;
constexpr uint64_t kWrite = kRead | kFsWriteFile | kFsRemoveFile | kFsRemoveDir | kFsMakeReg | kFsMakeDir | kFsTruncate;
// The NVIDIA device files are opened read-write and driven by ioctl (Landlock handles
// ioctl on devices from ABI 5; AllowBeneath drops the right below that).
constexpr uint64_t kDevice = kRead | kFsWriteFile | kFsIoctlDev;

absl::Status AllowAll(int ruleset, const std::vector<std::string>& paths, uint64_t access, int abi) {
  for (const std::string& path : paths) {
    if (absl::Status allowed = AllowBeneath(ruleset, path, access, abi); !allowed.ok()) return allowed;
  }
  return absl::OkStatus();
}

// The rules of `policy`: every path it may read or write. `out` learns which GPU devices.
absl::Status AddRules(int ruleset, const Policy& policy, int abi, Enforcement& out) {
  absl::Status status = AllowAll(ruleset, kSystemReadPaths, kRead, abi);
  if (status.ok()) status = AllowAll(ruleset, policy.read_paths, kRead, abi);
  if (status.ok()) status = AllowAll(ruleset, policy.write_paths, kWrite, abi);
  if (status.ok()) status = AllowBeneath(ruleset, "/dev/null", kRead | kFsWriteFile, abi);
  if (!status.ok() || !policy.gpu) return status;
  const std::vector<std::string> devices = NvidiaDeviceFiles();
  status = AllowAll(ruleset, kGpuReadPaths, kRead, abi);
  if (status.ok()) status = AllowAll(ruleset, kGpuWritePaths, kRead | kFsWriteFile | kFsTruncate, abi);
  if (status.ok()) status = AllowAll(ruleset, devices, kDevice, abi);
  // No device file is no error here: the engine then says that CUDA sees no device.
  if (status.ok()) {
    out.enforced.push_back(
        absl::StrCat("landlock-gpu-devices: ", devices.empty() ? "none in /dev" : absl::StrJoin(devices, " ")));
  }
  return status;
}

void RestrictFilesAndNetwork(const Policy& policy, Enforcement& out) {
  const long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, kCreateRulesetVersion);
  if (abi < 1) {
    out.missing.push_back(Errno("landlock (files, TCP, signals): landlock_create_ruleset"));
    return;
  }
  RulesetAttr attr{HandledFs(static_cast<int>(abi)), 0, 0};
  size_t attr_size = sizeof(uint64_t);
  if (abi >= 4) {
    attr.handled_access_net = kNetBindTcp | kNetConnectTcp;  // no rule allows any port
    attr_size = 2 * sizeof(uint64_t);
  }
  if (abi >= 6) {
    attr.scoped = kScopeAbstractUnixSocket | kScopeSignal;
    attr_size = sizeof(RulesetAttr);
  }
  const int ruleset = static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, attr_size, 0));
  if (ruleset < 0) {
    out.missing.push_back(Errno("landlock (files, TCP, signals): create ruleset"));
    return;
  }
  absl::Cleanup close_ruleset = [ruleset] { ::close(ruleset); };
  Enforcement rules;
  if (absl::Status added = AddRules(ruleset, policy, static_cast<int>(abi), rules); !added.ok()) {
    out.missing.push_back(std::string(added.message()));
    return;
  }
  if (::syscall(SYS_landlock_restrict_self, ruleset, 0) != 0) {
    out.missing.push_back(Errno("landlock: restrict_self"));
    return;
  }
  out.enforced.push_back(absl::StrCat("landlock-files (ABI ", abi, ")"));
  out.enforced.insert(out.enforced.end(), rules.enforced.begin(), rules.enforced.end());
  if (abi >= 4) {
    out.enforced.push_back("landlock-tcp");
  } else {
    out.missing.push_back(absl::StrCat("landlock-tcp: the kernel's Landlock ABI ", abi, " < 4"));
  }
  if (abi >= 6) {
    out.enforced.push_back("landlock-signal-scope");
  } else {
    out.missing.push_back(absl::StrCat("landlock-signal-scope: the kernel's Landlock ABI ", abi, " < 6"));
  }
}

// ---------------------------------------------------------------- the rest

absl::Status SetLimit(int resource, int64_t value, absl::string_view name) {
  struct rlimit limit;
  limit.rlim_cur = limit.rlim_max = static_cast<rlim_t>(value);
  if (::setrlimit(resource, &limit) != 0) return absl::InternalError(Errno(absl::StrCat("setrlimit ", name)));
  return absl::OkStatus();
}

// A memory rlimit, said by name and value. In a sanitizer build (tests only) the runtime's
// shadow memory is terabytes of reserved, writable address space, which RLIMIT_AS and
// RLIMIT_DATA both count, so neither can hold: said, never silent.
absl::Status LimitMemoryBy(int resource, absl::string_view name, int64_t bytes, Enforcement& out) {
  if (kShadowMemorySanitizer) {
    out.missing.push_back(absl::StrCat(name, " (", bytes, " bytes): not set in a ", kSanitizer,
                                       " build, whose shadow memory is reserved address space"));
    return absl::OkStatus();
  }
  RECAL_RETURN_IF_ERROR(SetLimit(resource, bytes, name));
  out.enforced.push_back(absl::StrCat(name, " ", bytes, " bytes"));
  return absl::OkStatus();
}

// The process's memory bounds: its cgroup first (joined while it may still move itself), then
// the rlimit that fits it. A GPU worker gets no RLIMIT_AS (CUDA's reservations would fail).
absl::Status LimitMemory(const Policy& policy, Enforcement& out) {
  if (!policy.memory_cgroup.empty()) {
    absl::StatusOr<std::string> joined = JoinMemoryCgroup(policy.memory_cgroup);
    if (!joined.ok()) {
      return absl::Status(joined.status().code(),
                          absl::StrCat("cannot join the memory cgroup the server made: ", joined.status().message()));
    }
    out.enforced.push_back(*std::move(joined));
  }
  if (policy.gpu) {
    out.missing.push_back(absl::StrCat("RLIMIT_AS: none on a GPU worker (CUDA reserves terabytes of address space)",
                                       policy.memory_bytes > 0 ? absl::StrCat("; ", policy.memory_bytes, " bytes asked") : ""));
  } else if (policy.memory_bytes > 0) {
    RECAL_RETURN_IF_ERROR(LimitMemoryBy(RLIMIT_AS, "RLIMIT_AS", policy.memory_bytes, out));
  }
  if (policy.data_bytes > 0) RECAL_RETURN_IF_ERROR(LimitMemoryBy(RLIMIT_DATA, "RLIMIT_DATA", policy.data_bytes, out));
  if (policy.gpu && policy.memory_cgroup.empty() && policy.data_bytes == 0) {
    out.missing.push_back("host memory: no bound on this GPU worker (no memory cgroup, no RLIMIT_DATA)");
  }
  return absl::OkStatus();
}

absl::Status SetLimits(const Policy& policy, Enforcement& out) {
  RECAL_RETURN_IF_ERROR(SetLimit(RLIMIT_CORE, 0, "RLIMIT_CORE"));
  RECAL_RETURN_IF_ERROR(SetLimit(RLIMIT_NOFILE, policy.open_files, "RLIMIT_NOFILE"));
  RECAL_RETURN_IF_ERROR(LimitMemory(policy, out));
  if (policy.file_bytes > 0) RECAL_RETURN_IF_ERROR(SetLimit(RLIMIT_FSIZE, policy.file_bytes, "RLIMIT_FSIZE"));
  return absl::OkStatus();
}

void IsolateNetwork(Enforcement& out) {
  if (::unshare(CLONE_NEWNET) == 0) {
    out.enforced.push_back("network-namespace");
    return;
  }
  const std::string privileged = Errno("unshare(CLONE_NEWNET)");
  // Without CAP_SYS_ADMIN a user namespace of its own may still hold a network namespace.
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0) {
    out.enforced.push_back("network-namespace (in a user namespace)");
    return;
  }
  out.missing.push_back(absl::StrCat("network-namespace: ", privileged, "; ", Errno("with CLONE_NEWUSER")));
}

absl::Status SwitchUser(const std::string& name, Enforcement& out) {
  struct passwd* user = ::getpwnam(name.c_str());
  if (user == nullptr) return absl::InvalidArgumentError(absl::StrCat("no user ", name, " on this machine"));
  if (::setgroups(0, nullptr) != 0 || ::setgid(user->pw_gid) != 0 || ::setuid(user->pw_uid) != 0) {
    return absl::PermissionDeniedError(Errno(absl::StrCat("cannot become user ", name)));
  }
  out.enforced.push_back(absl::StrCat("user ", name));
  return absl::OkStatus();
}

void DropCapabilities(Enforcement& out) {
  for (int cap = 0; cap <= 63; ++cap) ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);  // unknown caps: EINVAL
  ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  struct __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capset, &header, data) != 0) {
    out.missing.push_back(Errno("drop-capabilities: capset"));
    return;
  }
  out.enforced.push_back("no-capabilities");
}

absl::Status FilterSyscalls(Enforcement& out) {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return absl::InternalError("seccomp_init failed");
  absl::Cleanup release = [ctx] { seccomp_release(ctx); };
  int rc = 0;
  auto deny = [&](int syscall, int error = EPERM) {
    if (rc == 0 && syscall >= 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(error), syscall, 0);
  };
  for (const char* name :
       {"execve", "execveat", "fork", "vfork", "process_vm_readv", "process_vm_writev",
        "kcmp", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
        "fsmount", "fsconfig", "fspick", "mount_setattr", "swapon", "swapoff", "reboot",
        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "keyctl",
        "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "unshare", "setns",
        "acct", "quotactl", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
        "sethostname", "setdomainname", "iopl", "ioperm", "open_by_handle_at",
        "name_to_handle_at", "lookup_dcookie", "fanotify_init", "io_uring_setup",
        "io_uring_enter", "io_uring_register", "pidfd_send_signal", "pidfd_getfd", "tkill",
        "personality", "mknod", "mknodat"}) {
    deny(seccomp_syscall_resolve_name(name));
  }
  // glibc creates threads with clone3 and falls back to clone when it is missing.
  deny(seccomp_syscall_resolve_name("clone3"), ENOSYS);
  // Threads, not processes.
#if defined(RECAL_ASAN)
  // An ASan build (tests only) checks for leaks at exit: LeakSanitizer stops the threads from
  // a tracer that shares the address space, clone(CLONE_VM | CLONE_UNTRACED | ...), and
  // ptrace-attaches to each. That one kind of clone and ptrace stay allowed there; fork,
  // vfork and posix_spawn (no CLONE_UNTRACED, or no CLONE_VM) are refused as always.
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD | CLONE_UNTRACED, 0));
  }
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD | CLONE_VM, 0));
  }
#else
  deny(SCMP_SYS(ptrace));
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0));
  }
#endif
  // No sockets that reach a network: AF_UNIX (local pairs) only.
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EACCES), SCMP_SYS(socket), 1,
                          SCMP_A0(SCMP_CMP_NE, AF_UNIX));
  }
  // Signals only to itself.
  const scmp_datum_t self = static_cast<scmp_datum_t>(::getpid());
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(kill), 1, SCMP_A0(SCMP_CMP_NE, self));
  }
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(tgkill), 1, SCMP_A0(SCMP_CMP_NE, self));
  }
  if (rc == 0) rc = seccomp_load(ctx);
  if (rc != 0) return absl::InternalError(absl::StrCat("seccomp: ", std::strerror(-rc)));
  out.enforced.push_back("seccomp");
  return absl::OkStatus();
}

bool IsNvidiaDeviceName(absl::string_view name) {
  if (name == "nvidiactl" || name == "nvidia-uvm" || name == "nvidia-uvm-tools" || name == "nvidia-caps") return true;
  constexpr absl::string_view kPrefix = "nvidia";  // nvidia0, nvidia1, ...: one per GPU
  if (!absl::StartsWith(name, kPrefix) || name.size() == kPrefix.size()) return false;
  return std::all_of(name.begin() + kPrefix.size(), name.end(), [](char c) { return std::isdigit(c) != 0; });
}

}  // namespace

std::vector<std::string> NvidiaDeviceFiles(const std::string& dev) {
  std::vector<std::string> files;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dev, error)) {
    if (IsNvidiaDeviceName(entry.path().filename().string())) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> LoadedLibraries() {
  std::vector<std::string> paths;
  ::dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) {
        // The executable's name is empty, the vDSO's has no directory.
        if (info->dlpi_name == nullptr || std::strchr(info->dlpi_name, '/') == nullptr) return 0;
        char real[PATH_MAX];
        if (::realpath(info->dlpi_name, real) != nullptr) static_cast<std::vector<std::string>*>(data)->push_back(real);
        return 0;
      },
      &paths);
  return paths;
}

std::vector<std::string> LoadedLibraryDirs() {
  std::vector<std::string> dirs;
  for (const std::string& library : LoadedLibraries()) {
    std::string dir = std::filesystem::path(library).parent_path().string();
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(std::move(dir));
  }
  return dirs;
}

absl::StatusOr<Enforcement> Enter(const Policy& policy) {
  Enforcement out;
  // Dies with the server: a worker never outlives the process that watches it.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) return absl::InternalError(Errno("PR_SET_PDEATHSIG"));
  const pid_t parent = ::getppid();
  if (policy.server_pid > 0 ? parent != policy.server_pid : parent == 1) {
    return absl::AbortedError("the server is gone");
  }
  if (absl::Status limits = SetLimits(policy, out); !limits.ok()) return limits;
  out.enforced.push_back("rlimits");

  IsolateNetwork(out);
  if (!policy.user.empty()) {
    if (absl::Status switched = SwitchUser(policy.user, out); !switched.ok()) return switched;
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return absl::InternalError(Errno("PR_SET_NO_NEW_PRIVS"));
  out.enforced.push_back("no-new-privs");
  RestrictFilesAndNetwork(policy, out);
  DropCapabilities(out);
  if (absl::Status filtered = FilterSyscalls(out); !filtered.ok()) return filtered;
  return out;
}

}  // namespace recal::sandbox
