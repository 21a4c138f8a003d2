// The real recal-worker through WorkerRunner: the sandbox tried from inside, hostile models
// refused or stopped from outside, crashes reported, and a good model still recalibrated.
#include "server/jobs/worker_runner.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sanitizers.h"
#include "server/jobs/devices.h"
#include "tests/test_util.h"

namespace recal::jobs {
namespace {

// The plan of a job over an npy file in batches of 8, as admission would store it.
worker::v1::JobPlan NpyPlan(const std::string& path) {
  worker::v1::JobPlan plan;
  plan.set_batch_size(8);
  plan.mutable_data()->mutable_tensor_file()->set_format(v1::TensorFileSource::NPY);
  plan.mutable_data()->mutable_tensor_file()->set_path(path);
  return plan;
}

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const std::string kFixtures = RECAL_FIXTURES_DIR;
const std::string kHostile = kFixtures + "/hostile/";

class WorkerRunnerTest : public ::testing::Test {
 protected:
  WorkerRunnerTest() {
    fs::create_directories(tmp_.File("scratch"));
    options_.binary = RECAL_WORKER_BINARY;
    options_.scratch_root = tmp_.File("scratch");
    options_.data_roots = {kFixtures};
    options_.threads = 1;
  }

  // A job over 32 samples of 4 features (what the hostile models take), run to its end.
  absl::StatusOr<v1::RunReport> Recalibrate(WorkerRunner& runner, const std::string& model,
                                            const RunHooks& hooks = {}) {
    RecalibrationTask task;
    task.plan = NpyPlan(data_);
    task.model_path = model;
    task.data_roots = options_.data_roots;
    task.device = "cpu";
    task.scratch_dir = tmp_.File("job");
    fs::remove_all(task.scratch_dir);
    fs::create_directories(task.scratch_dir);
    return runner.Recalibrate(task, hooks);
  }

  // A good fixture model and its data (26 samples), on `device`, with its scratch directory.
  RecalibrationTask GoodTask(const std::string& device, const std::string& scratch) {
    RecalibrationTask task;
    task.plan = NpyPlan(kFixtures + "/data/bn1d_2d.npy");
    task.model_path = kFixtures + "/models/bn1d_2d.traced_train.pt";
    task.data_roots = {kFixtures};
    task.device = device;
    task.scratch_dir = tmp_.File(scratch);
    fs::create_directories(task.scratch_dir);
    return task;
  }

  void SetUp() override {
    ASSERT_EQ(testing::RunPython(
                  "import numpy as np, sys\n"
                  "np.save(sys.argv[1] + '/x4.npy', np.random.RandomState(0).randn(32, 4).astype('<f4'))\n",
                  tmp_.path()),
              0);
    data_ = tmp_.File("x4.npy");
    options_.data_roots.push_back(tmp_.path());
  }

  testing::TempDir tmp_;
  WorkerRunnerOptions options_;
  std::string data_;
};

TEST_F(WorkerRunnerTest, SandboxRefusesNetworkFilesExecForkAndSignals) {
  // A listening socket the worker must not reach.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t length = sizeof(address);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);

  testing::TempDir outside;  // outside every path the worker may use
  testing::WriteBytes(outside.File("secret"), "the server's secret");
  worker::v1::SandboxProbe probe;
  probe.set_tcp_port(ntohs(address.sin_port));
  probe.set_secret_path(outside.File("secret"));
  probe.set_outside_path(outside.File("written"));
  probe.set_server_pid(::getpid());
  // A library of the torch wheel that nothing loaded at start, from wherever the venv is (its
  // real path may be outside every system directory): as LibTorch loads cuDNN's parts late.
  probe.add_libraries(std::string(RECAL_TORCH_LIB_DIR) + "/libtorch_global_deps.so");
  WorkerRunner runner(options_);
  auto result = runner.Probe(probe);
  ::close(listener);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_GE(result->attempts_size(), 9);
  for (const auto& attempt : result->attempts()) {
    if (attempt.what() == "write in scratch" || attempt.what().rfind("load ", 0) == 0) {
      EXPECT_FALSE(attempt.refused()) << "the control " << attempt.what() << " failed: " << attempt.detail();
    } else {
      EXPECT_TRUE(attempt.refused()) << attempt.what() << " was allowed: " << attempt.detail();
    }
  }
  EXPECT_FALSE(fs::exists(outside.File("written")));
  // /etc/shadow too, which the server's own user may read when it is root.
  probe.set_secret_path("/etc/shadow");
  result = runner.Probe(probe);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->attempts(1).refused()) << result->attempts(1).detail();
}

TEST_F(WorkerRunnerTest, GpuWorkersGetTheGpuAndNoAddressSpaceLimitButAnotherBound) {
  options_.memory_bytes = int64_t{16} << 30;
  worker::v1::Task task;
  task.mutable_recalibrate()->set_device("cpu");
  std::vector<std::string> args = WorkerArguments(options_, task, "/scratch");
  EXPECT_EQ(args.front(), RECAL_WORKER_BINARY);
  EXPECT_THAT(args, ::testing::Contains("--memory_bytes=17179869184"));
  EXPECT_THAT(args, ::testing::Not(::testing::Contains("--gpu")));
  // Without a memory cgroup, a GPU worker's private memory is held by RLIMIT_DATA.
  task.mutable_recalibrate()->set_device("cuda:1");
  args = WorkerArguments(options_, task, "/scratch");
  EXPECT_THAT(args, ::testing::Contains("--gpu"));
  EXPECT_THAT(args, ::testing::Contains("--data_bytes=17179869184"));
  for (const std::string& arg : args) EXPECT_THAT(arg, ::testing::Not(HasSubstr("--memory_bytes"))) << arg;
  // With one, by its cgroup alone; a CPU worker by both.
  options_.memory_cgroup = sandbox::CgroupParent{"/sys/fs/cgroup/recal", sandbox::CgroupVersion::kV2};
  args = WorkerArguments(options_, task, "/scratch", "/sys/fs/cgroup/recal/recal-worker-1");
  EXPECT_THAT(args, ::testing::Contains("--memory_cgroup=/sys/fs/cgroup/recal/recal-worker-1"));
  for (const std::string& arg : args) {
    EXPECT_FALSE(absl::StartsWith(arg, "--memory_bytes") || absl::StartsWith(arg, "--data_bytes")) << arg;
  }
  task.mutable_recalibrate()->set_device("cpu");
  args = WorkerArguments(options_, task, "/scratch", "/sys/fs/cgroup/recal/recal-worker-2");
  EXPECT_THAT(args, ::testing::IsSupersetOf({"--memory_bytes=17179869184", "--memory_cgroup=/sys/fs/cgroup/recal/recal-worker-2"}));
  // Inspections and probes run on the CPU.
  args = WorkerArguments(options_, worker::v1::Task(), "/scratch");
  EXPECT_THAT(args, ::testing::Contains("--memory_bytes=17179869184"));
}

// The count decides, as it decides the server's devices: on a machine where recal-worker's
// LibTorch sees a GPU the job runs there; elsewhere the engine, not the sandbox, says there
// is none (a machine may have NVIDIA device files and no device CUDA can use).
TEST_F(WorkerRunnerTest, GpuJobEntersTheSandboxAndMeetsTheDevicesThere) {
  auto count = CountCudaDevices(RECAL_WORKER_BINARY, "");
  ASSERT_TRUE(count.ok()) << count.status();
  options_.memory_bytes = int64_t{3} << 30;
  WorkerRunner runner(options_);
  auto report = runner.Recalibrate(GoodTask("cuda:0", "gpu"), {});
  if (*count > 0) {
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->device(), "cuda:0");
    return;
  }
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition) << report.status();
  EXPECT_THAT(report.status().message(), HasSubstr("LibTorch sees 0 CUDA device(s)"));
}

TEST_F(WorkerRunnerTest, TheStartCheckRunsLibTorchInTheSandboxAndDescribesIt) {
  options_.memory_bytes = int64_t{16} << 30;
  options_.inspection_memory_bytes = int64_t{4} << 30;
  WorkerRunner runner(options_);
  auto sandboxed = runner.CheckWorker();
  ASSERT_TRUE(sandboxed.ok()) << sandboxed.status();
  EXPECT_THAT(sandboxed->enforced(), ::testing::Contains("seccomp"));
  EXPECT_THAT(sandboxed->enforced(), ::testing::Contains("no-new-privs"));
  for (const std::string& missing : sandboxed->missing()) std::cerr << "not enforced here: " << missing << "\n";
}

// The start's check runs under the tightest address-space limit a CPU worker gets.
TEST(WorkerArgumentsTest, TheStartCheckGetsTheTighterOfTheInspectionAndJobLimits) {
  WorkerRunnerOptions options;
  options.binary = "recal-worker";
  worker::v1::Task check;
  check.mutable_self_check();
  options.memory_bytes = int64_t{16} << 30;
  options.inspection_memory_bytes = int64_t{4} << 30;
  EXPECT_THAT(WorkerArguments(options, check, "/s"), ::testing::Contains("--memory_bytes=4294967296"));
  options.memory_bytes = int64_t{2} << 30;
  EXPECT_THAT(WorkerArguments(options, check, "/s"), ::testing::Contains("--memory_bytes=2147483648"));
  options.memory_bytes = 0;
  EXPECT_THAT(WorkerArguments(options, check, "/s"), ::testing::Contains("--memory_bytes=4294967296"));
  options.inspection_memory_bytes = 0;
  for (const std::string& arg : WorkerArguments(options, check, "/s")) {
    EXPECT_FALSE(absl::StartsWith(arg, "--memory_bytes")) << arg;
  }
}

// 1 GiB of address space does not even hold LibTorch's libraries: every upload (or job) would
// fail in its worker. Said at start, naming the limit and its flag.
TEST_F(WorkerRunnerTest, ALimitNoWorkerCanRunLibTorchUnderIsRefusedAtTheStartCheckNamingItsFlag) {
  if (kSanitizer != nullptr) GTEST_SKIP() << "a sanitizer build sets no RLIMIT_AS";
  options_.memory_bytes = int64_t{16} << 30;
  options_.inspection_memory_bytes = int64_t{1} << 30;
  auto checked = WorkerRunner(options_).CheckWorker();
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kFailedPrecondition) << checked.status();
  EXPECT_THAT(checked.status().message(), HasSubstr("limit of 1073741824 bytes (--inspection_memory_bytes)"));
  EXPECT_THAT(checked.status().message(), HasSubstr("though it can without that limit: raise --inspection_memory_bytes"));

  options_.memory_bytes = int64_t{1} << 30;
  options_.inspection_memory_bytes = 0;
  checked = WorkerRunner(options_).CheckWorker();
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kFailedPrecondition) << checked.status();
  EXPECT_THAT(checked.status().message(), HasSubstr("limit of 1073741824 bytes (--job_memory_bytes)"));
}

TEST_F(WorkerRunnerTest, UploadsOutsideTheAllowlistAreRefusedInTheWorker) {
  WorkerRunner runner(options_);
  auto layers = runner.Inspect(kHostile + "reads_file.pt");
  EXPECT_EQ(layers.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layers.status().message(), HasSubstr("aten::from_file"));
  layers = runner.Inspect(kHostile + "exploding_graph.pt");
  EXPECT_EQ(layers.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layers.status().message(), HasSubstr("nodes"));
  layers = runner.Inspect(kFixtures + "/models/resnet18.traced_eval.pt");
  ASSERT_TRUE(layers.ok()) << layers.status();
  EXPECT_EQ(layers->layers_size(), 20);
}

// The inspection cap (4 GiB, --inspection_memory_bytes' default) holds the biggest fixtures'
// inspections: ResNet-50 as an exported program and as TorchScript.
TEST_F(WorkerRunnerTest, TheBiggestFixturesAreInspectedUnderTheInspectionCap) {
  if (kSanitizer != nullptr) GTEST_SKIP() << "a sanitizer build sets no RLIMIT_AS";
  options_.memory_bytes = int64_t{16} << 30;
  options_.inspection_memory_bytes = int64_t{4} << 30;
  worker::v1::Task inspect;
  inspect.mutable_inspect();
  EXPECT_THAT(WorkerArguments(options_, inspect, "/s"), ::testing::Contains("--memory_bytes=4294967296"));
  options_.inspections = std::make_shared<InspectionSlots>(InspectionBounds{1, int64_t{4} << 30, 0, absl::Minutes(5)});
  WorkerRunner runner(options_);
  for (const char* model : {"zoo_resnet50.exported_train.pt2", "zoo_resnet50.exported_eval.pt2"}) {
    auto layers = runner.Inspect(kFixtures + "/models/" + model);
    ASSERT_TRUE(layers.ok()) << model << ": " << layers.status();
    EXPECT_EQ(layers->layers_size(), 53) << model;
  }
  EXPECT_EQ(options_.inspections->running(), 0);  // each slot given back
}

// A host whose inspection budget is taken refuses, naming the flag, and starts no worker.
TEST_F(WorkerRunnerTest, AFullHostRefusesAnInspectionNamingItsBound) {
  options_.inspection_memory_bytes = int64_t{4} << 30;
  options_.inspections = std::make_shared<InspectionSlots>(
      InspectionBounds{1, int64_t{8} << 30, 0, absl::Milliseconds(10)});
  auto held = options_.inspections->Acquire("someone", int64_t{4} << 30);
  ASSERT_TRUE(held.ok());
  WorkerRunner runner(options_);
  auto layers = runner.Inspect(kFixtures + "/models/resnet18.traced_eval.pt");
  EXPECT_EQ(layers.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(layers.status().message(), HasSubstr("--max_concurrent_inspections"));
}

TEST_F(WorkerRunnerTest, AllowedFileOperatorsStillMeetTheSandbox) {
  // An administrator allowed them; the sandbox still keeps the model to its scratch.
  options_.extra_allowed_ops = {"aten::from_file", "aten::save"};
  WorkerRunner runner(options_);
  auto read = Recalibrate(runner, kHostile + "reads_file.pt");
  EXPECT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr("/etc/passwd"));
  // aten::save writes through a std::ofstream that fails silently: the job may even
  // succeed, but the file (where the server's user could write) must not exist.
  Recalibrate(runner, kHostile + "writes_file.pt").status().IgnoreError();
  EXPECT_FALSE(fs::exists(kHostile + "written.pt"));
  // The control: with the sandbox's walls where they are, the same model run in this very
  // test process (no sandbox) would have written it.
  EXPECT_TRUE(fs::is_directory(kHostile));
}

TEST_F(WorkerRunnerTest, EndlessLoopIsStoppedAtTheDeadlineAndOnCancel) {
  WorkerRunner runner(options_);
  RunHooks hooks;
  hooks.deadline = absl::Now() + absl::Seconds(1);
  auto start = std::chrono::steady_clock::now();
  auto report = Recalibrate(runner, kHostile + "endless_loop.pt", hooks);
  EXPECT_EQ(report.status().code(), absl::StatusCode::kDeadlineExceeded) << report.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

  std::atomic<bool> cancel{false};
  RunHooks cancellable;
  cancellable.cancel = &cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    cancel = true;
  });
  start = std::chrono::steady_clock::now();
  report = Recalibrate(runner, kHostile + "endless_loop.pt", cancellable);
  canceller.join();
  EXPECT_EQ(report.status().code(), absl::StatusCode::kCancelled) << report.status();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500 + 5000));
}

TEST_F(WorkerRunnerTest, MemoryBombFailsAgainstTheLimit) {
  if (kSanitizer != nullptr) {
    GTEST_SKIP() << "a " << kSanitizer << " build sets no RLIMIT_AS (its shadow memory is reserved address "
                 << "space; server/sandbox/sandbox.cc says so in Enforcement::missing): no limit to fail against";
  }
  options_.memory_bytes = int64_t{3} << 30;
  WorkerRunner runner(options_);
  auto report = Recalibrate(runner, kHostile + "memory_bomb.pt");
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(), HasSubstr("memory"));
  EXPECT_THAT(report.status().message(), HasSubstr("(the worker's memory limit: 3221225472 bytes (--job_memory_bytes)"));
}

// The worker groups of this process under `dir` (other processes may make theirs there).
std::vector<std::string> RecalWorkerGroups(const std::string& dir) {
  std::vector<std::string> groups;
  const std::string mine = absl::StrCat("recal-worker-", ::getpid(), "-");
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (absl::StartsWith(entry.path().filename().string(), mine)) groups.push_back(entry.path().string());
  }
  return groups;
}

// The bound of a GPU worker, tried with a CPU worker held as a GPU worker is (no RLIMIT_AS):
// its memory cgroup, where this machine's kernel lets the test make one, kills the worker
// at its limit, and the job says which limit and which flag raises it.
TEST_F(WorkerRunnerTest, AWorkerPastItsMemoryCgroupIsKilledAndTheJobNamesTheLimitAndItsFlag) {
  const absl::StatusOr<sandbox::CgroupParent>& parent = WorkerCgroupParent();
  if (!parent.ok()) GTEST_SKIP() << "no memory cgroup can be made here: " << parent.status().message();
  options_.memory_cgroup = parent;
  options_.address_space_limit_on_cpu = false;
  options_.memory_bytes = int64_t{1536} << 20;
  WorkerRunner runner(options_);
  auto report = Recalibrate(runner, kHostile + "memory_bomb.pt");
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInternal) << report.status();
  EXPECT_THAT(report.status().message(),
              HasSubstr("was killed by SIGKILL (Killed): it exceeded its memory limit of 1610612736 bytes "
                        "(--job_memory_bytes) and the kernel stopped it there"));
  // Its group is gone with it (other processes' groups may share the parent), and the next
  // job runs in a group of its own (with room for a sanitizer's shadow memory).
  EXPECT_THAT(RecalWorkerGroups(parent->dir), ::testing::IsEmpty());
  options_.memory_bytes = int64_t{16} << 30;
  auto good = WorkerRunner(options_).Recalibrate(GoodTask("cpu", "after"), {});
  EXPECT_TRUE(good.ok()) << good.status();
  EXPECT_THAT(RecalWorkerGroups(parent->dir), ::testing::IsEmpty());
}

// Without a cgroup, the GPU's fallback: RLIMIT_DATA refuses the allocation past the limit.
TEST_F(WorkerRunnerTest, WithoutACgroupAGpuWorkersPrivateMemoryIsHeldByRlimitData) {
  if (kSanitizer != nullptr) GTEST_SKIP() << "a " << kSanitizer << " build sets no RLIMIT_DATA (its shadow memory)";
  options_.address_space_limit_on_cpu = false;
  options_.memory_bytes = int64_t{3} << 30;
  WorkerRunner runner(options_);
  auto sandboxed = runner.CheckWorker();
  ASSERT_TRUE(sandboxed.ok()) << sandboxed.status();
  EXPECT_THAT(sandboxed->enforced(), ::testing::Contains("RLIMIT_DATA 3221225472 bytes"));
  auto report = Recalibrate(runner, kHostile + "memory_bomb.pt");
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.status().message(), HasSubstr("can't allocate memory: you tried to allocate 4294967296 bytes"));
  EXPECT_THAT(report.status().message(),
              HasSubstr("(the worker's memory limit: 3221225472 bytes (--job_memory_bytes), held by RLIMIT_DATA. Raise "
                        "--job_memory_bytes for this model, or run it with a smaller batch_size)"));
}

// What holds the workers' memory is said at start: the cgroup in `enforced`, as its files
// state it, or in `missing` why there is none and what holds them instead.
TEST_F(WorkerRunnerTest, TheStartCheckSaysWhichMemoryBoundHolds) {
  options_.memory_bytes = int64_t{16} << 30;
  options_.inspection_memory_bytes = int64_t{4} << 30;
  options_.memory_cgroup = absl::FailedPreconditionError("cgroup v2: /sys/fs/cgroup is read-only");
  auto sandboxed = WorkerRunner(options_).CheckWorker();
  ASSERT_TRUE(sandboxed.ok()) << sandboxed.status();
  if (kSanitizer == nullptr) {
    EXPECT_THAT(sandboxed->enforced(), ::testing::Contains("RLIMIT_AS 4294967296 bytes"));
  }
  EXPECT_THAT(sandboxed->missing(),
              ::testing::Contains("memory-cgroup: none for the workers (cgroup v2: /sys/fs/cgroup is read-only): a CPU "
                                  "worker's memory is held by RLIMIT_AS alone, a GPU worker's by RLIMIT_DATA (its "
                                  "private memory: not the page cache, nor what the NVIDIA driver maps for it)"));

  const absl::StatusOr<sandbox::CgroupParent>& parent = WorkerCgroupParent();
  if (!parent.ok()) GTEST_SKIP() << "no memory cgroup can be made here: " << parent.status().message();
  options_.memory_cgroup = parent;
  sandboxed = WorkerRunner(options_).CheckWorker();
  ASSERT_TRUE(sandboxed.ok()) << sandboxed.status();
  const bool v2 = parent->version == sandbox::CgroupVersion::kV2;
  EXPECT_THAT(sandboxed->enforced(),
              ::testing::Contains(::testing::StartsWith(absl::StrCat(
                  "memory-cgroup (", v2 ? "v2): memory.max" : "v1): memory.limit_in_bytes", " 4294967296 bytes, "))));
  for (const std::string& missing : sandboxed->missing()) EXPECT_THAT(missing, ::testing::Not(HasSubstr("memory-cgroup")));
}

TEST_F(WorkerRunnerTest, CrashedWorkerIsReportedBySignal) {
  WorkerRunner runner(options_);
  worker::v1::SandboxProbe probe;
  probe.set_crash(true);
  auto result = runner.Probe(probe);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(result.status().message(), HasSubstr("SIGSEGV"));
  // The runner is still good for the next task.
  auto layers = runner.Inspect(kFixtures + "/models/bn1d_2d.scripted_eval.pt");
  EXPECT_TRUE(layers.ok()) << layers.status();
}

TEST_F(WorkerRunnerTest, GoodModelIsRecalibratedWithItsFilesInScratch) {
  WorkerRunner runner(options_);
  const RecalibrationTask task = GoodTask("cpu", "good");
  int progress_events = 0;
  RunHooks hooks;
  hooks.on_progress = [&](const worker::v1::Progress& p) { ++progress_events; };
  auto report = runner.Recalibrate(task, hooks);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->samples(), 26);
  EXPECT_EQ(progress_events, 4);
  for (const char* name : {"model.pt", "bn.safetensors", "report.json"}) {
    EXPECT_TRUE(fs::is_regular_file(fs::path(task.scratch_dir) / name)) << name;
  }
}


// A stand-in for recal-worker: a shell script, executable, one file per call.
std::string FakeWorker(const testing::TempDir& tmp, const std::string& body) {
  static int made = 0;
  const std::string path = tmp.File(absl::StrCat("fake-worker-", ++made));
  testing::WriteBytes(path, "#!/bin/sh\n" + body + "\n");
  fs::permissions(path, fs::perms::owner_all);
  return path;
}

// A worker that sends an event that is no event and lives on is killed by the runner: the
// error says it broke the protocol, not that something outside killed it (the SIGKILL is
// the runner's own, not the out-of-memory killer's).
TEST(WorkerRunnerProtocol, AWorkerThatBreaksTheProtocolIsSaidToHaveBrokenIt) {
  testing::TempDir tmp;
  WorkerRunnerOptions options;
  // Descriptor 3 is the events pipe: a 3-byte message that does not parse, then silence.
  options.binary = FakeWorker(tmp, "printf '\\003\\377\\377\\377' >&3; exec sleep 60");
  testing::WriteBytes(tmp.File("model.pt"), "any bytes");
  WorkerRunner runner(options);
  const absl::Time start = absl::Now();
  auto layers = runner.Inspect(tmp.File("model.pt"));
  EXPECT_EQ(layers.status().code(), absl::StatusCode::kInternal) << layers.status();
  EXPECT_THAT(layers.status().message(), HasSubstr("the worker broke the protocol"));
  EXPECT_THAT(layers.status().message(), ::testing::Not(HasSubstr("out-of-memory")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // not the sleep's minute
}

// What the real recal-worker's LibTorch sees decides the devices: on a machine without a
// GPU, auto is CPU workers and cuda:0 is refused naming 0 devices; with GPUs, the same
// rules over their count.
TEST(CountCudaDevices, TheWorkersCountDecidesTheDevices) {
  auto count = CountCudaDevices(RECAL_WORKER_BINARY, "");
  ASSERT_TRUE(count.ok()) << count.status();
  const CudaDeviceCounter counter = [] { return CountCudaDevices(RECAL_WORKER_BINARY, ""); };
  auto automatic = ResolveDevices("auto", 2, counter);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  if (*count == 0) {
    EXPECT_EQ(*automatic, std::vector<std::string>({"cpu", "cpu"}));
  } else {
    EXPECT_EQ(automatic->size(), static_cast<size_t>(*count));
    EXPECT_EQ(automatic->front(), "cuda:0");
  }
  const std::string beyond = absl::StrCat("cuda:", *count);
  auto refused = ResolveDevices(beyond, 2, counter);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr(absl::StrCat("device ", beyond, " requested, but recal-worker's LibTorch sees ", *count,
                                     " CUDA device(s)")));
}

TEST(CountCudaDevices, AWorkerThatCannotTellIsAnErrorNamingIt) {
  testing::TempDir tmp;
  auto missing = CountCudaDevices(tmp.File("no-such-worker"), "");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(missing.status().message(), HasSubstr("cannot start " + tmp.File("no-such-worker")));

  auto failing = CountCudaDevices(FakeWorker(tmp, "echo 'recal-worker: no driver' >&2; exit 2"), "");
  EXPECT_EQ(failing.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(failing.status().message(),
              HasSubstr("--print_cuda_devices exited with code 2: recal-worker: no driver"));

  auto garbage = CountCudaDevices(FakeWorker(tmp, "echo two"), "");
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(garbage.status().message(), HasSubstr("printed 'two', not a number of devices"));

  auto two = CountCudaDevices(FakeWorker(tmp, "echo 'a warning' >&2; echo 2"), "");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(*two, 2);

  // GPUs that the GPU sandbox keeps from the driver: said at start with the driver's answer,
  // never taken for a machine without GPUs (auto would then run every job on the CPU).
  auto blocked = CountCudaDevices(FakeWorker(
      tmp, "case \"$*\" in *--gpu*) echo 'recal-worker: no CUDA device: cuInit says CUDA_ERROR_OPERATING_SYSTEM' >&2;"
           " echo 0 ;; *) echo 2 ;; esac"),
      "");
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kFailedPrecondition) << blocked.status();
  EXPECT_THAT(blocked.status().message(), HasSubstr("sees 2 CUDA device(s), but 0 inside the GPU sandbox"));
  EXPECT_THAT(blocked.status().message(), HasSubstr("CUDA_ERROR_OPERATING_SYSTEM"));
  EXPECT_THAT(blocked.status().message(), HasSubstr("--devices=cpu"));

  // Counted in the sandbox as the user the workers run as: one that may not open the device
  // files is said at start, naming the user and the fix, not found at the first GPU job.
  const std::string as_user_only_root_sees =
      FakeWorker(tmp, "case \"$*\" in *--gpu*--user=recal*) echo 'recal-worker: no CUDA device: cuInit says "
                      "CUDA_ERROR_NO_DEVICE' >&2; echo 0 ;; *) echo 2 ;; esac");
  EXPECT_EQ(*CountCudaDevices(as_user_only_root_sees, ""), 2) << "as the server's user";
  auto as_user = CountCudaDevices(as_user_only_root_sees, "recal");
  EXPECT_EQ(as_user.status().code(), absl::StatusCode::kFailedPrecondition) << as_user.status();
  EXPECT_THAT(as_user.status().message(), HasSubstr("but 0 inside the GPU sandbox as --worker_user=recal"));
  EXPECT_THAT(as_user.status().message(), HasSubstr("CUDA_ERROR_NO_DEVICE"));
  EXPECT_THAT(as_user.status().message(), HasSubstr("usermod -aG video recal"));

  // Killed at the deadline, whether it keeps its output open or closes it and hangs.
  for (const std::string body : {"exec sleep 30", "exec >&- 2>&-; exec sleep 30"}) {
    const auto start = std::chrono::steady_clock::now();
    auto hung = CountCudaDevices(FakeWorker(tmp, body), "", absl::Milliseconds(300));
    EXPECT_EQ(hung.status().code(), absl::StatusCode::kDeadlineExceeded) << body << ": " << hung.status();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10)) << body;
  }
}

}  // namespace
}  // namespace recal::jobs
