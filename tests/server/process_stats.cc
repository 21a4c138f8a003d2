#include "tests/server/process_stats.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace recal::testing {
namespace {

// The whole of a /proc file, "" when it cannot be read. By read(2): a process that exits
// mid-read fails the read with ESRCH, which std::ifstream's buffer would throw.
std::string ReadProcFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char buffer[4096];
  ssize_t got = 0;
  while ((got = ::read(fd, buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<size_t>(got));
  ::close(fd);
  return got < 0 ? "" : text;
}

// The number after `key` in a "Key:  value [kB]" file such as /proc/PID/status; -1 if absent.
int64_t FieldOf(const std::string& path, const std::string& key) {
  std::istringstream file(ReadProcFile(path));
  std::string line;
  while (std::getline(file, line)) {
    if (!absl::StartsWith(line, key)) continue;
    std::istringstream value(line.substr(key.size()));
    int64_t number = -1;
    value >> number;
    return number;
  }
  return -1;
}

pid_t ParentOf(const std::string& pid) {
  const std::string stat = ReadProcFile("/proc/" + pid + "/stat");
  const size_t name_end = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (name_end == std::string::npos || name_end + 2 >= stat.size()) return -1;
  std::istringstream rest(stat.substr(name_end + 2));
  char state = '\0';
  pid_t parent = -1;
  rest >> state >> parent;
  return parent;
}

}  // namespace

int ThreadsOf(pid_t pid) { return static_cast<int>(FieldOf(absl::StrCat("/proc/", pid, "/status"), "Threads:")); }

int64_t ResidentBytesOf(pid_t pid) {
  const int64_t kib = FieldOf(absl::StrCat("/proc/", pid, "/status"), "VmRSS:");
  return kib < 0 ? -1 : kib * 1024;
}

int CountChildren(pid_t parent, const std::string& program) {
  int count = 0;
  std::error_code error;
  // increment(error), not ++: /proc changes while it is listed, and nothing here may throw
  // (the samplers run on threads of their own).
  for (std::filesystem::directory_iterator it("/proc", error), end; !error && it != end; it.increment(error)) {
    const std::string pid = it->path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (ParentOf(pid) != parent) continue;
    const std::string cmdline = ReadProcFile("/proc/" + pid + "/cmdline");
    const std::string argv0 = cmdline.substr(0, cmdline.find('\0'));
    if (argv0 == program || absl::EndsWith(argv0, "/" + program)) ++count;
  }
  return count;
}

int64_t MemAvailableBytes() {
  const int64_t kib = FieldOf("/proc/meminfo", "MemAvailable:");
  return kib < 0 ? -1 : kib * 1024;
}

PeriodicSampler::PeriodicSampler(std::chrono::milliseconds period, std::function<void()> sample)
    : thread_([this, period, sample = std::move(sample)] {
        while (!stop_.load()) {
          sample();
          std::this_thread::sleep_for(period);
        }
      }) {}

void PeriodicSampler::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

}  // namespace recal::testing
