#include "tests/server/process_stats.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace recal::testing {
namespace {

// The number after `key` in a "Key:  value [kB]" file such as /proc/PID/status; -1 if absent.
int64_t FieldOf(const std::string& path, const std::string& key) {
  std::ifstream file(path);
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
  std::ifstream file("/proc/" + pid + "/stat");
  std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
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
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string pid = entry.path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (ParentOf(pid) != parent) continue;
    std::ifstream cmdline(entry.path() / "cmdline", std::ios::binary);
    std::string argv0;
    std::getline(cmdline, argv0, '\0');
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
