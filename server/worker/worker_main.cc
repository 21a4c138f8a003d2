// recal-worker: runs one task of the server in a sandbox (server/sandbox). Started by the
// server for every job and every upload, never by hand:
//
//   recal-worker --scratch=DIR [--read_path=DIR ...] [--memory_bytes=N | --data_bytes=N]
//                [--memory_cgroup=DIR] [--file_bytes=N] [--user=NAME] [--gpu]
//                stdin: Task (+ pushed batches), fd 3: events, fd 4: model
//   recal-worker --print_cuda_devices [--gpu]   the number of CUDA devices its LibTorch sees
//                                       (with --gpu: inside the GPU sandbox), on stdout
//                                       (recal-server asks, for --devices)
//
// The protocol is proto/recal/worker/v1/worker.proto. Exits 0 when the last event (results,
// layers or a failure) was sent; anything else is a crash for the server to report.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "common/command_line.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engine/batch_moments.h"
#include "server/engine/devices.h"
#include "server/sandbox/sandbox.h"
#include "server/worker/channel.h"
#include "server/worker/worker_task.h"

ABSL_FLAG(std::string, scratch, "", "the task's scratch directory: the only place it may write");
ABSL_FLAG(std::vector<std::string>, read_path, {}, "files or directories the task may read (data roots)");
ABSL_FLAG(int64_t, memory_bytes, 0, "address-space limit (RLIMIT_AS); 0: none");
ABSL_FLAG(int64_t, data_bytes, 0,
          "limit of private writable memory (RLIMIT_DATA; a GPU worker's without a memory cgroup); 0: none");
ABSL_FLAG(std::string, memory_cgroup, "",
          "a cgroup the server made for this worker, with its memory limit: joined before anything runs");
ABSL_FLAG(int64_t, file_bytes, 0, "largest file it may write (RLIMIT_FSIZE); 0: none");
ABSL_FLAG(std::string, user, "", "run as this user (when started as root)");
ABSL_FLAG(int64_t, server_pid, 0, "the server that started it: stop if the parent is another (0: if it is pid 1)");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{1} << 30, "largest message accepted on stdin");
ABSL_FLAG(bool, print_cuda_devices, false,
          "print the number of CUDA devices LibTorch sees and exit (no task; with --gpu inside the GPU sandbox: "
          "recal-server, which loads no LibTorch, asks for --devices)");
ABSL_FLAG(bool, gpu, false, "a task on a CUDA device: admit the NVIDIA devices and driver, no address-space limit");

namespace {

constexpr int kEventsFd = 3;
constexpr int kModelFd = 4;

int Fail(const std::string& message) {
  std::cerr << "recal-worker: " << message << "\n";
  return 2;
}

// What the worker loads after it entered the sandbox, readable there. LibTorch dlopens parts
// of itself late (cuDNN's sub-libraries, NVRTC and its builtins, libtorch_cuda_linalg): the
// directories of every library loaded so far (the torch wheel's lib/, its nvidia/*/lib/
// dependencies, wherever the venv is), and the wheel's whole nvidia/ beside torch/ for the
// packages nothing has loaded yet. On a GPU the driver's libcuda.so.1 is loaded first, so
// that its directory (and what it loads beside it, the PTX JIT) is found wherever it lies
// (/usr/local/nvidia/lib64 in some containers, LD_LIBRARY_PATH): the CUDA runtime's own
// dlopen of it later finds it loaded.
std::vector<std::string> LibraryReadPaths(bool gpu) {
  if (gpu) ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);  // none: CUDA then says so in the engine
  std::vector<std::string> paths = recal::sandbox::LoadedLibraryDirs();
  for (const std::string& library : recal::sandbox::LoadedLibraries()) {
    const std::filesystem::path path(library);
    if (path.filename() != "libtorch_cpu.so") continue;
    const std::filesystem::path nvidia = path.parent_path().parent_path().parent_path() / "nvidia";
    if (std::filesystem::is_directory(nvidia)) paths.push_back(nvidia.string());
  }
  return paths;
}

// The sandbox of the flags. Without --scratch (--print_cuda_devices) nothing is writable.
recal::sandbox::Policy PolicyFromFlags() {
  recal::sandbox::Policy policy;
  policy.read_paths = absl::GetFlag(FLAGS_read_path);
  policy.gpu = absl::GetFlag(FLAGS_gpu);
  for (std::string& path : LibraryReadPaths(policy.gpu)) policy.read_paths.push_back(std::move(path));
  const std::string scratch = absl::GetFlag(FLAGS_scratch);
  if (!scratch.empty()) policy.write_paths = {scratch};
  policy.memory_bytes = absl::GetFlag(FLAGS_memory_bytes);
  policy.data_bytes = absl::GetFlag(FLAGS_data_bytes);
  policy.memory_cgroup = absl::GetFlag(FLAGS_memory_cgroup);
  policy.file_bytes = absl::GetFlag(FLAGS_file_bytes);
  policy.user = absl::GetFlag(FLAGS_user);
  policy.server_pid = absl::GetFlag(FLAGS_server_pid);
  return policy;
}

// With --gpu the count is taken inside the sandbox a GPU job gets: what its LibTorch will see.
int PrintCudaDevices() {
  if (absl::GetFlag(FLAGS_gpu)) {
    auto enforcement = recal::sandbox::Enter(PolicyFromFlags());
    if (!enforcement.ok()) return Fail(absl::StrCat("cannot enter the sandbox: ", enforcement.status().ToString()));
  }
  absl::StatusOr<int> count = recal::engine::CudaDeviceCount();
  if (!count.ok()) return Fail(count.status().ToString());
  if (*count == 0) std::cerr << "recal-worker: no CUDA device: " << recal::engine::CudaDriverStatus() << "\n";
  std::cout << *count << "\n" << std::flush;
  return std::cout ? 0 : Fail("cannot write to stdout");
}

}  // namespace

int main(int argc, char** argv) {
  recal::ParseCommandLineOrExit(argc, argv, "recal-worker",
                                "runs one task of recal-server in a sandbox (started by the server, not by hand)",
                                recal::engine::GpuStatisticsBuild());
  if (absl::GetFlag(FLAGS_print_cuda_devices)) return PrintCudaDevices();
  const std::string scratch = absl::GetFlag(FLAGS_scratch);
  if (scratch.empty()) return Fail("--scratch is required");
  if (::fcntl(kEventsFd, F_GETFD) < 0) return Fail("no events channel on file descriptor 3");
  ::setenv("TMPDIR", scratch.c_str(), 1);

  auto enforcement = recal::sandbox::Enter(PolicyFromFlags());
  if (!enforcement.ok()) return Fail(absl::StrCat("cannot enter the sandbox: ", enforcement.status().ToString()));

  const auto send = [](const recal::worker::v1::Event& event) {
    return recal::worker::WriteMessage(kEventsFd, event);
  };
  recal::worker::v1::Event sandboxed;
  for (const std::string& s : enforcement->enforced) sandboxed.mutable_sandboxed()->add_enforced(s);
  for (const std::string& s : enforcement->missing) sandboxed.mutable_sandboxed()->add_missing(s);
  if (!send(sandboxed).ok()) return Fail("the server is gone");

  recal::worker::MessageReader input(STDIN_FILENO, absl::GetFlag(FLAGS_max_message_bytes));
  recal::worker::v1::Task task;
  auto read = input.Read(&task);
  if (!read.ok() || !*read) return Fail("no task on stdin");
  recal::worker::TaskContext context;
  context.model = ::fcntl(kModelFd, F_GETFD) >= 0 ? absl::StrCat("fd:", kModelFd) : "";
  context.scratch = scratch;
  context.input = &input;
  const absl::Status done = recal::worker::RunTask(task, context, send);
  if (!done.ok()) return Fail(done.ToString());
  return 0;
}
