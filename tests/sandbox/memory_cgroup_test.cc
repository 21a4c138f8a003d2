// A worker's memory cgroup: why none can be made, read from a made-up cgroup tree (no side
// effect left behind); and, where this machine's kernel lets this process make groups (cgroup
// v2 with the memory controller, or the v1 memory hierarchy; as root or in a delegated
// group), a child past its limit killed there and counted. Skipped, saying why, where not.
#include "server/sandbox/memory_cgroup.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/test_util.h"

namespace recal::sandbox {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A cgroup tree in a temporary directory: `files` point at its /proc files.
class FakeCgroups {
 public:
  FakeCgroups() {
    files.self_cgroup = tmp.File("self_cgroup");
    files.mountinfo = tmp.File("mountinfo");
  }
  // The process's groups ("0::/svc\n"), and one cgroup2 mount of `root` at tmp/cg.
  void Mount(const std::string& self_cgroup, const std::string& root = "/", const std::string& fstype = "cgroup2",
             const std::string& super_options = "rw") {
    testing::WriteBytes(files.self_cgroup, self_cgroup);
    testing::WriteBytes(files.mountinfo, absl::StrCat("25 1 0:22 / /proc rw - proc proc rw\n30 25 0:26 ", root, " ",
                                                      tmp.File("cg"), " rw,nosuid shared:9 - ", fstype, " cgroup ",
                                                      super_options, "\n"));
  }
  // A group below the mount with these control files.
  std::string Group(const std::string& path, const std::string& controllers, const std::string& procs) {
    const std::string dir = tmp.File("cg") + path;
    fs::create_directories(dir);
    testing::WriteBytes(dir + "/cgroup.controllers", controllers);
    testing::WriteBytes(dir + "/cgroup.subtree_control", "");
    testing::WriteBytes(dir + "/cgroup.procs", procs);
    return dir;
  }

  testing::TempDir tmp;
  CgroupFiles files;
};

std::string Self() { return absl::StrCat(::getpid(), "\n"); }

TEST(CgroupParent, AGroupWithoutTheMemoryControllerIsRefusedNamingWhatItHas) {
  FakeCgroups cgroups;
  cgroups.Mount("0::/system.slice/recal.service\n");
  const std::string dir = cgroups.Group("/system.slice/recal.service", "cpu io pids\n", Self());
  auto parent = FindCgroupParent(cgroups.files);
  EXPECT_EQ(parent.status().code(), absl::StatusCode::kFailedPrecondition) << parent.status();
  EXPECT_THAT(parent.status().message(), HasSubstr(absl::StrCat(
                                             "cgroup v2: ", dir,
                                             " is not given the memory controller (its cgroup.controllers: 'cpu io pids')")));
  // And no v1 memory hierarchy either: both reasons are said.
  EXPECT_THAT(parent.status().message(), HasSubstr("cgroup v1: " + cgroups.files.self_cgroup + " names no memory hierarchy"));
}

// cgroup v2 has no processes in inner groups: a server that shares its group cannot give
// children the memory controller, and says who shares it and what to do.
TEST(CgroupParent, AGroupSharedWithOtherProcessesIsRefusedSayingHowToGiveTheServerItsOwn) {
  FakeCgroups cgroups;
  cgroups.Mount("0::/user.slice/session-3.scope\n");
  const std::string dir = cgroups.Group("/user.slice/session-3.scope", "cpu memory pids\n", Self() + "4242\n777\n");
  auto parent = FindCgroupParent(cgroups.files);
  EXPECT_EQ(parent.status().code(), absl::StatusCode::kFailedPrecondition) << parent.status();
  EXPECT_THAT(parent.status().message(), HasSubstr(absl::StrCat("cgroup v2: ", dir, " holds 2 other process(es) (4242 777)")));
  EXPECT_THAT(parent.status().message(), HasSubstr("systemd: Delegate=yes"));
  EXPECT_FALSE(fs::exists(dir + "/recal-server"));
}

// Alone in its group, the process moves into a leaf first; where that is refused (here the
// made-up tree has no control files in the new leaf), the leaf is removed again.
TEST(CgroupParent, AMoveThatFailsLeavesNoLeafBehind) {
  FakeCgroups cgroups;
  cgroups.Mount("0::/recal\n");
  const std::string dir = cgroups.Group("/recal", "memory\n", Self());
  auto parent = FindCgroupParent(cgroups.files);
  EXPECT_EQ(parent.status().code(), absl::StatusCode::kFailedPrecondition) << parent.status();
  EXPECT_THAT(parent.status().message(), HasSubstr("cannot open " + dir + "/recal-server/cgroup.procs"));
  EXPECT_FALSE(fs::exists(dir + "/recal-server"));
  EXPECT_EQ(testing::ReadBytes(dir + "/cgroup.subtree_control"), "");
}

// A container's mount shows its own group as the mount's root: the group is found below it,
// and a group outside every mount is said to be so.
TEST(CgroupParent, TheGroupIsFoundBelowTheMountsRoot) {
  FakeCgroups cgroups;
  cgroups.Mount("0::/kubepods/pod1/c1\n", "/kubepods/pod1");
  cgroups.Group("/c1", "cpu\n", Self());
  EXPECT_THAT(FindCgroupParent(cgroups.files).status().message(),
              HasSubstr(cgroups.tmp.File("cg") + "/c1 is not given the memory controller"));
  cgroups.Mount("0::/elsewhere\n", "/kubepods/pod1");
  EXPECT_THAT(FindCgroupParent(cgroups.files).status().message(),
              HasSubstr("cgroup v2: this process's group /elsewhere lies under no cgroup2 mount"));
}

// Where v2 has no memory controller (a hybrid host), the v1 memory hierarchy is the one
// tried: here its groups cannot be made in the made-up tree, which is said.
TEST(CgroupParent, TheV1MemoryHierarchyIsTriedWhereV2HasNoMemory) {
  FakeCgroups cgroups;
  cgroups.Mount("4:memory:/batch/job7\n0::/\n", "/", "cgroup", "rw,memory");
  fs::create_directories(cgroups.tmp.File("cg") + "/batch/job7");
  auto parent = FindCgroupParent(cgroups.files);
  EXPECT_EQ(parent.status().code(), absl::StatusCode::kFailedPrecondition) << parent.status();
  EXPECT_THAT(parent.status().message(), HasSubstr("cgroup v2: this process's group / lies under no cgroup2 mount"));
  EXPECT_THAT(parent.status().message(),
              HasSubstr("cgroup v1: cannot open " + cgroups.tmp.File("cg") + "/batch/job7/recal-worker-"));
  EXPECT_THAT(parent.status().message(), HasSubstr("/memory.limit_in_bytes"));
}

// ---------------------------------------------------------------- on this machine's kernel

// The kernel's groups, or a skip saying why this machine gives none.
#define PARENT_OR_SKIP(parent)                                                                      \
  absl::StatusOr<CgroupParent> parent = FindCgroupParent();                                         \
  if (!parent.ok()) GTEST_SKIP() << "no memory cgroup can be made here: " << parent.status().message()

// How a forked child that ran `body` ended, and what the body returned.
struct ChildEnd {
  int status = 0;
  std::string said;
};

ChildEnd InChild(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, "pipe failed"};
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    const std::string said = body();
    (void)!::write(fds[1], said.data(), said.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  ChildEnd end;
  char buffer[1024];
  for (ssize_t got; (got = ::read(fds[0], buffer, sizeof(buffer))) > 0;) end.said.append(buffer, static_cast<size_t>(got));
  ::close(fds[0]);
  ::waitpid(child, &end.status, 0);
  return end;
}

TEST(MemoryCgroup, AChildPastItsLimitIsKilledThereAndCounted) {
  PARENT_OR_SKIP(parent);
  auto group = MemoryCgroup::Create(*parent, int64_t{64} << 20);
  ASSERT_TRUE(group.ok()) << group.status();
  const std::string dir = (*group)->dir();
  const ChildEnd end = InChild([&]() -> std::string {
    if (absl::StatusOr<std::string> joined = JoinMemoryCgroup(dir); !joined.ok()) return joined.status().ToString();
    // Four times the limit, touched page by page.
    constexpr size_t kBytes = size_t{256} << 20;
    char* memory = static_cast<char*>(std::malloc(kBytes));
    if (memory == nullptr) return "malloc failed";
    for (size_t i = 0; i < kBytes; i += 4096) memory[i] = 1;
    return "touched it all";
  });
  ASSERT_TRUE(WIFSIGNALED(end.status)) << "the child ended with status " << end.status << ": " << end.said;
  EXPECT_EQ(WTERMSIG(end.status), SIGKILL);
  EXPECT_GE((*group)->OomKills(), 1);
  EXPECT_TRUE((*group)->Remove().ok());
  EXPECT_FALSE(fs::exists(dir));
}

TEST(MemoryCgroup, AJoinedProcessIsInItAndSaysItsLimitAsTheKernelStatesIt) {
  PARENT_OR_SKIP(parent);
  auto group = MemoryCgroup::Create(*parent, int64_t{96} << 20);
  ASSERT_TRUE(group.ok()) << group.status();
  const ChildEnd end = InChild([&] {
    absl::StatusOr<std::string> joined = JoinMemoryCgroup((*group)->dir());
    return joined.ok() ? *joined : joined.status().ToString();
  });
  ASSERT_TRUE(WIFEXITED(end.status) && WEXITSTATUS(end.status) == 0) << end.said;
  const bool v2 = parent->version == CgroupVersion::kV2;
  EXPECT_THAT(end.said, HasSubstr(absl::StrCat("memory-cgroup (", v2 ? "v2): memory.max" : "v1): memory.limit_in_bytes",
                                               " 100663296 bytes")));
  EXPECT_THAT(end.said, HasSubstr("(" + (*group)->dir() + ")"));
  EXPECT_EQ((*group)->OomKills(), 0);
}

}  // namespace
}  // namespace recal::sandbox
