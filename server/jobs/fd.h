// Descriptors for talking to a worker process (worker_process.h, worker_pipes.h): owned,
// closed on exec, and numbered 10 or above, so that a child's dup2 onto its descriptors 0-4
// never overwrites another source descriptor.
#pragma once

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal::jobs {

// A descriptor closed when it goes out of scope.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

absl::Status Pipe(Fd& read_end, Fd& write_end);

// `path` opened for reading; an error says "cannot open <what> <path>".
absl::StatusOr<Fd> OpenForReading(const std::string& path, absl::string_view what);

}  // namespace recal::jobs
