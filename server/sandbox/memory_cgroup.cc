#include "server/sandbox/memory_cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace recal::sandbox {
namespace {

namespace fs = std::filesystem;

constexpr char kWorkerPrefix[] = "recal-worker-";

std::string ErrnoText(absl::string_view what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InternalError(ErrnoText(absl::StrCat("cannot read ", path)));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A cgroup control file takes each write(2) as one command: the whole value in one call.
absl::Status WriteControl(const std::string& path, absl::string_view value) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(ErrnoText(absl::StrCat("cannot open ", path)));
  const ssize_t written = ::write(fd, value.data(), value.size());
  const int write_errno = errno;
  ::close(fd);
  if (written == static_cast<ssize_t>(value.size())) return absl::OkStatus();
  errno = written < 0 ? write_errno : EIO;
  return absl::InternalError(ErrnoText(absl::StrCat("cannot write '", value, "' to ", path)));
}

bool HasWord(absl::string_view text, absl::string_view word) {
  for (absl::string_view token : absl::StrSplit(text, absl::ByAnyChar(" \n\t,"), absl::SkipEmpty())) {
    if (token == word) return true;
  }
  return false;
}

// The value of `key` in a flat-keyed file ("oom_kill 3" lines), 0 where it is absent.
int64_t KeyedValue(const std::string& path, absl::string_view key) {
  absl::StatusOr<std::string> text = ReadText(path);
  if (!text.ok()) return 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t value = 0;
    if (fields.size() == 2 && fields[0] == key && absl::SimpleAtoi(fields[1], &value)) return value;
  }
  return 0;
}

// This process's group in the v2 hierarchy ("0::/path") or the v1 memory one ("N:memory:/path").
std::optional<std::string> OwnGroup(absl::string_view self_cgroup, CgroupVersion version) {
  for (absl::string_view line : absl::StrSplit(self_cgroup, '\n', absl::SkipEmpty())) {
    std::vector<std::string> fields = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    const bool v2_line = fields[0] == "0" && fields[1].empty();
    if (version == CgroupVersion::kV2 ? v2_line : HasWord(fields[1], "memory")) return fields[2];
  }
  return std::nullopt;
}

// mountinfo escapes blanks and backslashes in paths as three octal digits (\040).
std::string UnescapeOctal(absl::string_view text) {
  const auto octal = [](char c) { return c >= '0' && c <= '7'; };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 3 < text.size() && octal(text[i + 1]) && octal(text[i + 2]) && octal(text[i + 3])) {
      out.push_back(static_cast<char>((text[i + 1] - '0') * 64 + (text[i + 2] - '0') * 8 + (text[i + 3] - '0')));
      i += 3;
      continue;
    }
    out.push_back(text[i]);
  }
  return out;
}

// Where `group` of the hierarchy lies in this process's file system: a mount of it (cgroup2,
// or cgroup with the memory option) whose root holds the group.
std::optional<std::string> MountedDir(absl::string_view mountinfo, CgroupVersion version, const std::string& group) {
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n', absl::SkipEmpty())) {
    // ID PARENT MAJ:MIN ROOT MOUNT-POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER-OPTIONS
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    size_t dash = 6;
    while (dash < fields.size() && fields[dash] != "-") ++dash;
    if (dash + 3 >= fields.size()) continue;
    const bool matches = version == CgroupVersion::kV2
                             ? fields[dash + 1] == "cgroup2"
                             : fields[dash + 1] == "cgroup" && HasWord(fields[dash + 3], "memory");
    if (!matches) continue;
    const std::string root = UnescapeOctal(fields[3]);
    const std::string point = UnescapeOctal(fields[4]);
    if (root == "/") return point + (group == "/" ? "" : group);
    if (group == root) return point;
    if (absl::StartsWith(group, root + "/")) return point + group.substr(root.size());
  }
  return std::nullopt;
}

absl::StatusOr<std::string> OwnGroupDir(const CgroupFiles& files, CgroupVersion version) {
  const std::string name = VersionName(version);
  RECAL_ASSIGN_OR_RETURN(const std::string self, ReadText(files.self_cgroup));
  const std::optional<std::string> group = OwnGroup(self, version);
  if (!group) {
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": ", files.self_cgroup, " names no ", version == CgroupVersion::kV2 ? "v2 group" : "memory hierarchy"));
  }
  RECAL_ASSIGN_OR_RETURN(const std::string mounts, ReadText(files.mountinfo));
  std::optional<std::string> dir = MountedDir(mounts, version, *group);
  if (!dir) {
    return absl::FailedPreconditionError(absl::StrCat(name, ": this process's group ", *group, " lies under no ",
                                                      version == CgroupVersion::kV2 ? "cgroup2" : "memory cgroup",
                                                      " mount (", files.mountinfo, ")"));
  }
  return *std::move(dir);
}

// The pids in a cgroup.procs text other than this process's.
std::vector<std::string> OtherProcesses(absl::string_view procs) {
  const std::string self = absl::StrCat(::getpid());
  std::vector<std::string> others;
  for (absl::string_view pid : absl::StrSplit(procs, '\n', absl::SkipEmpty())) {
    if (pid != self) others.emplace_back(pid);
  }
  return others;
}

// A v2 group with processes cannot enable a controller for its children ("no internal
// processes"), so this process, alone in `dir`, moves into a leaf of its own first. Undone if
// the controller is refused after all (a process joined meanwhile, or `dir` is not writable).
absl::Status GiveMemoryToChildren(const std::string& dir) {
  RECAL_ASSIGN_OR_RETURN(const std::string procs, ReadText(dir + "/cgroup.procs"));
  const std::vector<std::string> others = OtherProcesses(procs);
  if (!others.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cgroup v2: ", dir, " holds ", others.size(), " other process(es) (", absl::StrJoin(others.begin(),
        others.begin() + std::min<size_t>(others.size(), 5), " "), others.size() > 5 ? " ..." : "",
        "), and a v2 group with processes cannot give its children the memory controller: run recal-server "
        "alone in a cgroup of its own (systemd: Delegate=yes; a container: a private, writable cgroup "
        "namespace)"));
  }
  const std::string leaf = absl::StrCat(dir, "/", kServerLeaf);
  if (::mkdir(leaf.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat("cgroup v2: ", ErrnoText(absl::StrCat("cannot make ", leaf))));
  }
  const std::string self = absl::StrCat(::getpid());
  absl::Status moved = WriteControl(leaf + "/cgroup.procs", self);
  absl::Status enabled = moved.ok() ? WriteControl(dir + "/cgroup.subtree_control", "+memory") : moved;
  if (enabled.ok()) return absl::OkStatus();
  if (moved.ok()) WriteControl(dir + "/cgroup.procs", self).IgnoreError();
  ::rmdir(leaf.c_str());
  return absl::FailedPreconditionError(absl::StrCat("cgroup v2: ", enabled.message()));
}

absl::StatusOr<CgroupParent> FindV2(const CgroupFiles& files) {
  RECAL_ASSIGN_OR_RETURN(std::string dir, OwnGroupDir(files, CgroupVersion::kV2));
  RECAL_ASSIGN_OR_RETURN(const std::string controllers, ReadText(dir + "/cgroup.controllers"));
  if (!HasWord(controllers, "memory")) {
    return absl::FailedPreconditionError(
        absl::StrCat("cgroup v2: ", dir, " is not given the memory controller (its cgroup.controllers: '",
                     absl::StripAsciiWhitespace(controllers), "')"));
  }
  RECAL_ASSIGN_OR_RETURN(const std::string subtree, ReadText(dir + "/cgroup.subtree_control"));
  if (!HasWord(subtree, "memory")) RECAL_RETURN_IF_ERROR(GiveMemoryToChildren(dir));
  return CgroupParent{std::move(dir), CgroupVersion::kV2};
}

// Whether `name` is a worker group (recal-worker-<server pid>-<random>) of a server that is
// gone. Another server may share the parent (a v1 hierarchy is often shared): its groups,
// empty between their making and their worker's joining, are not this one's to remove.
bool OfAServerThatIsGone(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kWorkerPrefix)) return false;
  int64_t server = 0;
  const size_t dash = name.find('-');
  if (dash == absl::string_view::npos || !absl::SimpleAtoi(name.substr(0, dash), &server) || server <= 0) return false;
  return ::kill(static_cast<pid_t>(server), 0) != 0 && errno == ESRCH;
}

// Empty groups of workers whose server died (a worker dies with its server).
void RemoveStaleGroups(const std::string& dir) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    if (entry.is_directory(error) && OfAServerThatIsGone(entry.path().filename().string())) {
      ::rmdir(entry.path().c_str());  // a group still in use stays (EBUSY)
    }
  }
}

// Says now, not at the first job, that a group cannot be made or limited here.
absl::Status Probe(const CgroupParent& parent) {
  RECAL_ASSIGN_OR_RETURN(std::unique_ptr<MemoryCgroup> probe, MemoryCgroup::Create(parent, int64_t{64} << 20));
  return probe->Remove();
}

absl::StatusOr<CgroupParent> Usable(absl::StatusOr<CgroupParent> parent) {
  if (!parent.ok()) return parent;
  RemoveStaleGroups(parent->dir);
  if (absl::Status probed = Probe(*parent); !probed.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(VersionName(parent->version), ": ", probed.message()));
  }
  return parent;
}

}  // namespace

std::string VersionName(CgroupVersion version) { return version == CgroupVersion::kV2 ? "cgroup v2" : "cgroup v1"; }

absl::StatusOr<CgroupParent> FindCgroupParent(const CgroupFiles& files) {
  absl::StatusOr<CgroupParent> v2 = Usable(FindV2(files));
  if (v2.ok()) return v2;
  absl::StatusOr<std::string> v1_dir = OwnGroupDir(files, CgroupVersion::kV1);
  absl::StatusOr<CgroupParent> v1 =
      v1_dir.ok() ? Usable(CgroupParent{*std::move(v1_dir), CgroupVersion::kV1}) : v1_dir.status();
  if (v1.ok()) return v1;
  // FAILED_PRECONDITION whatever failed: a file that cannot be read is a machine without that
  // hierarchy, and both reasons are said.
  return absl::FailedPreconditionError(absl::StrCat(v2.status().message(), "; ", v1.status().message()));
}

absl::StatusOr<std::unique_ptr<MemoryCgroup>> MemoryCgroup::Create(const CgroupParent& parent, int64_t max_bytes) {
  absl::BitGen random;
  const std::string dir = absl::StrCat(parent.dir, "/", kWorkerPrefix, ::getpid(), "-",
                                       absl::Hex(absl::Uniform<uint64_t>(random), absl::kZeroPad16));
  if (::mkdir(dir.c_str(), 0755) != 0) return absl::InternalError(ErrnoText(absl::StrCat("cannot make ", dir)));
  std::unique_ptr<MemoryCgroup> group(new MemoryCgroup(dir, parent.version, max_bytes));
  const std::string limit = absl::StrCat(max_bytes);
  const bool v2 = parent.version == CgroupVersion::kV2;
  RECAL_RETURN_IF_ERROR(WriteControl(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"), limit));
  // No swap: a worker past its limit is killed, not paged out. Absent where the kernel does
  // not account swap (v1 without swapaccount), and then nothing to bound.
  const std::string swap = dir + (v2 ? "/memory.swap.max" : "/memory.memsw.limit_in_bytes");
  std::error_code error;
  if (fs::exists(swap, error)) RECAL_RETURN_IF_ERROR(WriteControl(swap, v2 ? "0" : limit));
  return group;
}

int64_t MemoryCgroup::OomKills() const {
  return KeyedValue(dir_ + (version_ == CgroupVersion::kV2 ? "/memory.events" : "/memory.oom_control"), "oom_kill");
}

absl::Status MemoryCgroup::Remove() {
  if (removed_) return absl::OkStatus();
  // A process just waited for may still be leaving the group for a moment.
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (::rmdir(dir_.c_str()) == 0 || errno == ENOENT) {
      removed_ = true;
      return absl::OkStatus();
    }
    if (errno != EBUSY) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::InternalError(ErrnoText(absl::StrCat("cannot remove the worker's cgroup ", dir_)));
}

absl::StatusOr<std::string> JoinMemoryCgroup(const std::string& dir) {
  const std::string self = absl::StrCat(::getpid());
  RECAL_RETURN_IF_ERROR(WriteControl(dir + "/cgroup.procs", self));
  RECAL_ASSIGN_OR_RETURN(const std::string procs, ReadText(dir + "/cgroup.procs"));
  if (!HasWord(procs, self)) {
    return absl::InternalError(absl::StrCat("joined the cgroup ", dir, " but is not in its cgroup.procs"));
  }
  std::error_code error;
  const bool v2 = fs::exists(dir + "/memory.max", error);
  const std::string limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
  const std::string swap_file = v2 ? "memory.swap.max" : "memory.memsw.limit_in_bytes";
  RECAL_ASSIGN_OR_RETURN(const std::string limit, ReadText(absl::StrCat(dir, "/", limit_file)));
  const absl::StatusOr<std::string> swap = ReadText(absl::StrCat(dir, "/", swap_file));
  return absl::StrCat("memory-cgroup (", v2 ? "v2" : "v1", "): ", limit_file, " ", absl::StripAsciiWhitespace(limit),
                      " bytes, ", swap.ok() ? absl::StrCat(swap_file, " ", absl::StripAsciiWhitespace(*swap))
                                            : "swap not accounted by this kernel",
                      " (", dir, ")");
}

}  // namespace recal::sandbox
