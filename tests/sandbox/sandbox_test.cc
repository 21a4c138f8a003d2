// server/sandbox entered in a forked child (it cannot be left): what a GPU policy admits and
// sets, on this machine (with or without NVIDIA devices), and the helpers the worker uses to
// find what it must keep readable.
#include "server/sandbox/sandbox.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <future>
#include <set>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sanitizers.h"
#include "tests/test_util.h"

namespace recal::sandbox {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// Runs `body` in a forked child that has entered `policy`; returns what the body wrote
// (one line per finding), or why the child did not get that far.
std::string InSandbox(const Policy& policy, const std::function<std::string(const Enforcement&)>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    Policy with_parent = policy;
    with_parent.server_pid = ::getppid();
    auto entered = Enter(with_parent);
    const std::string out = entered.ok() ? body(*entered) : "cannot enter: " + entered.status().ToString();
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buffer[4096];
  for (ssize_t got; (got = ::read(fds[0], buffer, sizeof(buffer))) > 0;) out.append(buffer, static_cast<size_t>(got));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) absl::StrAppend(&out, "\nchild died: status ", status);
  return out;
}

bool LandlockHere(const Enforcement& e) {
  for (const std::string& s : e.enforced) {
    if (s.rfind("landlock-files", 0) == 0) return true;
  }
  return false;
}

TEST(Sandbox, NvidiaDeviceFilesAreTheNodesCudaOpens) {
  testing::TempDir dev;
  for (const char* name : {"nvidiactl", "nvidia0", "nvidia12", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset",
                           "nvidia", "nvidiafoo", "nvidia1x", "null", "urandom"}) {
    testing::WriteBytes(dev.File(name), "");
  }
  fs::create_directory(dev.File("nvidia-caps"));
  std::vector<std::string> names;
  for (const std::string& path : NvidiaDeviceFiles(dev.path())) names.push_back(fs::path(path).filename().string());
  EXPECT_THAT(names, ElementsAre("nvidia-caps", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia12", "nvidiactl"));
  EXPECT_TRUE(NvidiaDeviceFiles(dev.File("absent")).empty());
}

TEST(Sandbox, LoadedLibraryDirsNameWhereTheLoadedLibrariesAre) {
  const std::vector<std::string> libraries = LoadedLibraries();
  ASSERT_FALSE(libraries.empty());
  bool libc = false;
  for (const std::string& library : libraries) {
    EXPECT_TRUE(fs::path(library).is_absolute()) << library;
    EXPECT_TRUE(fs::is_regular_file(library)) << library;  // real paths, not links
    libc = libc || fs::path(library).filename() == "libc.so.6";
  }
  EXPECT_TRUE(libc) << absl::StrJoin(libraries, " ");
  const std::vector<std::string> dirs = LoadedLibraryDirs();
  for (const std::string& library : libraries) {
    EXPECT_THAT(dirs, Contains(fs::path(library).parent_path().string()));
  }
  EXPECT_EQ(std::set<std::string>(dirs.begin(), dirs.end()).size(), dirs.size()) << "duplicates";
}

TEST(Sandbox, GpuPolicyEntersWithoutAddressSpaceLimitWhateverTheDevices) {
  testing::TempDir scratch;
  Policy policy;
  policy.write_paths = {scratch.path()};
  policy.memory_bytes = int64_t{1} << 30;  // asked for, and not set: CUDA reserves address space
  policy.gpu = true;
  const std::string out = InSandbox(policy, [&](const Enforcement& e) {
    std::string lines = absl::StrCat("enforced: ", absl::StrJoin(e.enforced, "; "), "\nmissing: ",
                                     absl::StrJoin(e.missing, "; "), "\n");
    struct rlimit limit;
    ::getrlimit(RLIMIT_AS, &limit);
    absl::StrAppend(&lines, "RLIMIT_AS infinite: ", limit.rlim_cur == RLIM_INFINITY, "\n");
    // What the driver reads is readable, what it is not given is not.
    for (const char* path : {"/sys/devices/system/cpu/online", "/proc/devices"}) {
      const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
      absl::StrAppend(&lines, "read ", path, ": ", fd >= 0, "\n");
      if (fd >= 0) ::close(fd);
    }
    const int etc = ::open("/etc/hostname", O_RDONLY | O_CLOEXEC);
    absl::StrAppend(&lines, "read /etc/hostname: ", etc >= 0, " landlock: ", LandlockHere(e), "\n");
    return lines;
  });
  ASSERT_THAT(out, HasSubstr("enforced: ")) << out;
  EXPECT_THAT(out, HasSubstr("RLIMIT_AS infinite: 1")) << out;
  EXPECT_THAT(out, HasSubstr("RLIMIT_AS: none on a GPU worker")) << out;
  EXPECT_THAT(out, HasSubstr("1073741824 bytes asked")) << out;
  EXPECT_THAT(out, HasSubstr("seccomp")) << out;
  if (out.find("landlock: 1") == std::string::npos) GTEST_SKIP() << "no Landlock here: " << out;
  const std::string devices = NvidiaDeviceFiles().empty() ? "none in /dev" : NvidiaDeviceFiles().front();
  EXPECT_THAT(out, HasSubstr("landlock-gpu-devices: " + devices)) << out;
  EXPECT_THAT(out, HasSubstr("read /sys/devices/system/cpu/online: 1")) << out;
  EXPECT_THAT(out, HasSubstr("read /proc/devices: 1")) << out;
  EXPECT_THAT(out, HasSubstr("read /etc/hostname: 0")) << out;
}

// The CUDA driver names its threads from another thread (fopen("/proc/self/task/TID/comm",
// "w"): O_TRUNC, which Landlock checks apart from writing) and fails cuInit when it cannot
// (seen on an H200, driver 580): a GPU worker may, for its own threads only.
TEST(Sandbox, GpuPolicyLetsTheWorkerNameItsOwnThreadsAndNoOtherProcesss) {
  testing::TempDir scratch;
  Policy policy;
  policy.write_paths = {scratch.path()};
  policy.gpu = true;
  const std::string out = InSandbox(policy, [&](const Enforcement& e) {
    auto write = [](const std::string& path) {
      const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
      const bool ok = fd >= 0 && ::write(fd, "named", 5) == 5;
      if (fd >= 0) ::close(fd);
      return ok;
    };
    std::promise<pid_t> tid;
    std::promise<void> done;
    std::thread thread([&] {
      tid.set_value(static_cast<pid_t>(::gettid()));
      done.get_future().wait();
    });
    const std::string own = absl::StrCat("/proc/self/task/", tid.get_future().get(), "/comm");
    const std::string lines = absl::StrCat("own thread: ", write(own), "\nparent: ",
                                           write(absl::StrCat("/proc/", ::getppid(), "/comm")),
                                           "\nlandlock: ", LandlockHere(e), "\n");
    done.set_value();
    thread.join();
    return lines;
  });
  EXPECT_THAT(out, HasSubstr("own thread: 1")) << out;
  if (out.find("landlock: 1") == std::string::npos) GTEST_SKIP() << "no Landlock here: " << out;
  EXPECT_THAT(out, HasSubstr("parent: 0")) << out;
}

// Without a memory cgroup, a GPU worker's private memory is held by RLIMIT_DATA (which does
// not count CUDA's PROT_NONE reservations); without that either, the sandbox says so.
TEST(Sandbox, GpuPolicyHoldsPrivateMemoryByRlimitDataOrSaysThereIsNoBound) {
  testing::TempDir scratch;
  Policy policy;
  policy.write_paths = {scratch.path()};
  policy.gpu = true;
  policy.data_bytes = int64_t{3} << 30;
  const auto limits = [](const Enforcement& e) {
    struct rlimit limit;
    ::getrlimit(RLIMIT_DATA, &limit);
    return absl::StrCat("RLIMIT_DATA: ", limit.rlim_cur, "\nenforced: ", absl::StrJoin(e.enforced, "; "),
                        "\nmissing: ", absl::StrJoin(e.missing, "; "), "\n");
  };
  std::string out = InSandbox(policy, limits);
  ASSERT_THAT(out, HasSubstr("enforced: ")) << out;
  if (kSanitizer != nullptr) {
    EXPECT_THAT(out, HasSubstr("RLIMIT_DATA (3221225472 bytes): not set in a")) << out;
  } else {
    EXPECT_THAT(out, HasSubstr("RLIMIT_DATA: 3221225472\n")) << out;
    EXPECT_THAT(out, HasSubstr("RLIMIT_DATA 3221225472 bytes")) << out;
  }
  EXPECT_THAT(out, ::testing::Not(HasSubstr("host memory: no bound"))) << out;
  policy.data_bytes = 0;
  out = InSandbox(policy, limits);
  EXPECT_THAT(out, HasSubstr("host memory: no bound on this GPU worker (no memory cgroup, no RLIMIT_DATA)")) << out;
}

// A worker the server made a memory cgroup for does not run outside it: a group it cannot
// join keeps it from entering the sandbox at all.
TEST(Sandbox, AMemoryCgroupThatCannotBeJoinedKeepsTheProcessOut) {
  testing::TempDir scratch;
  Policy policy;
  policy.write_paths = {scratch.path()};
  policy.memory_cgroup = scratch.File("no-such-group");
  const std::string out = InSandbox(policy, [](const Enforcement&) { return std::string("entered"); });
  EXPECT_THAT(out, HasSubstr("cannot enter: INTERNAL: cannot join the memory cgroup the server made: cannot open " +
                             scratch.File("no-such-group") + "/cgroup.procs"))
      << out;
  EXPECT_THAT(out, ::testing::Not(HasSubstr("entered"))) << out;
}

TEST(Sandbox, CpuPolicyKeepsItsAddressSpaceLimitAndNoGpuPaths) {
  testing::TempDir scratch;
  Policy policy;
  policy.write_paths = {scratch.path()};
  policy.memory_bytes = int64_t{64} << 30;
  const std::string out = InSandbox(policy, [&](const Enforcement& e) {
    struct rlimit limit;
    ::getrlimit(RLIMIT_AS, &limit);
    const int fd = ::open("/proc/devices", O_RDONLY | O_CLOEXEC);
    return absl::StrCat("RLIMIT_AS: ", limit.rlim_cur, "\nread /proc/devices: ", fd >= 0, " landlock: ",
                        LandlockHere(e), "\nmissing: ", absl::StrJoin(e.missing, "; "), "\n");
  });
  ASSERT_THAT(out, HasSubstr("RLIMIT_AS: ")) << out;
  EXPECT_THAT(out, ::testing::Not(HasSubstr("GPU"))) << out;
  if (out.find("not set in a") == std::string::npos) {  // a sanitizer build sets none, and says so
    EXPECT_THAT(out, HasSubstr(absl::StrCat("RLIMIT_AS: ", int64_t{64} << 30))) << out;
  }
  if (out.find("landlock: 1") != std::string::npos) {
    EXPECT_THAT(out, HasSubstr("read /proc/devices: 0")) << out;
  }
}

TEST(Sandbox, LibraryDirsGivenAsReadPathsStayReadable) {
  // A library directory outside the system's (a venv's torch/lib): what the worker admits.
  testing::TempDir lib;
  testing::WriteBytes(lib.File("libpart.so.1"), "not really a library");
  testing::TempDir other;
  testing::WriteBytes(other.File("secret"), "x");
  testing::TempDir scratch;
  Policy policy;
  policy.write_paths = {scratch.path()};
  policy.read_paths = {lib.path()};
  const std::string out = InSandbox(policy, [&](const Enforcement& e) {
    const int in = ::open(lib.File("libpart.so.1").c_str(), O_RDONLY | O_CLOEXEC);
    const int out_fd = ::open(other.File("secret").c_str(), O_RDONLY | O_CLOEXEC);
    return absl::StrCat("lib: ", in >= 0, " other: ", out_fd >= 0, " landlock: ", LandlockHere(e));
  });
  EXPECT_THAT(out, HasSubstr("lib: 1")) << out;
  if (out.find("landlock: 1") != std::string::npos) {
    EXPECT_THAT(out, HasSubstr("other: 0")) << out;
  }
}

}  // namespace
}  // namespace recal::sandbox
