#include "common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace recal::data {

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty file path");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open '", path, "'"));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat("cannot stat '", path, "'"));
  }
  absl::Status problem;
  if (S_ISDIR(st.st_mode)) {
    problem = absl::InvalidArgumentError(absl::StrCat("'", path, "' is a directory, not a file"));
  } else if (!S_ISREG(st.st_mode)) {
    problem = absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  } else if (st.st_size == 0) {
    problem = absl::InvalidArgumentError(absl::StrCat("'", path, "' is empty"));
  }
  if (!problem.ok()) {
    ::close(fd);
    return problem;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  ::close(fd);  // the mapping keeps the file open
  if (data == MAP_FAILED) {
    return absl::ErrnoToStatus(mmap_errno, absl::StrCat("cannot mmap '", path, "'"));
  }
  // Batches are read front to back; this doubles the kernel's read-ahead.
  ::madvise(data, size, MADV_SEQUENTIAL);
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::MappedFile(std::string path, void* data, size_t size)
    : path_(std::move(path)), data_(data), size_(size) {}

MappedFile::~MappedFile() { ::munmap(data_, size_); }

}  // namespace recal::data
