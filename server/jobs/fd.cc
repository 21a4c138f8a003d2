#include "server/jobs/fd.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace recal::jobs {
namespace {

// `fd` moved to 10 or above (see fd.h).
absl::StatusOr<Fd> High(int fd) {
  const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  ::close(fd);
  if (high < 0) return absl::ErrnoToStatus(errno, "fcntl(F_DUPFD_CLOEXEC)");
  return Fd(high);
}

}  // namespace

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

absl::Status Pipe(Fd& read_end, Fd& write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe2");
  auto r = High(fds[0]);
  auto w = High(fds[1]);
  if (!r.ok()) return r.status();
  if (!w.ok()) return w.status();
  read_end = *std::move(r);
  write_end = *std::move(w);
  return absl::OkStatus();
}

absl::StatusOr<Fd> OpenForReading(const std::string& path, absl::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", what, " ", path));
  return High(fd);
}

}  // namespace recal::jobs
