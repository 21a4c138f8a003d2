#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace recal {
namespace {

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status FsyncDirectory(const std::string& dir, const std::string& for_path) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot open directory '", dir, "' to fsync the rename of '",
                            for_path, "'"));
  }
  absl::Status status;
  if (::fsync(fd) != 0) {
    status = absl::ErrnoToStatus(
        errno, absl::StrCat("cannot fsync directory '", dir, "' after writing '", for_path, "'"));
  }
  ::close(fd);
  return status;
}

}  // namespace

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Open(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("cannot write a file with an empty path");
  if (path.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat("cannot write '", path, "': it names a directory"));
  }
  // The random part keeps two writers of one target in the same process (or a stale temp
  // file from a crashed run with a recycled pid) from colliding; O_EXCL makes sure of it.
  absl::BitGen gen;
  std::string temp_path;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    temp_path = absl::StrFormat("%s.tmp.%d.%016x", path, static_cast<int>(::getpid()),
                                absl::Uniform<uint64_t>(gen));
    fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot create temporary file '", temp_path,
                                                   "' to write '", path, "'"));
  }
  std::FILE* file = ::fdopen(fd, "wb");
  if (file == nullptr) {
    const int err = errno;
    ::close(fd);
    ::unlink(temp_path.c_str());
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open stream on '", temp_path, "'"));
  }
  return AtomicFileWriter(path, std::move(temp_path), file);
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string temp_path, std::FILE* file)
    : path_(std::move(path)), temp_path_(std::move(temp_path)), file_(file) {}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      file_(std::exchange(other.file_, nullptr)) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    temp_path_ = std::move(other.temp_path_);
    file_ = std::exchange(other.file_, nullptr);
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (file_ == nullptr) return;
  std::fclose(file_);
  file_ = nullptr;
  ::unlink(temp_path_.c_str());
}

absl::Status AtomicFileWriter::Append(absl::string_view bytes) {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("writer for '", path_, "' is already committed or abandoned"));
  }
  if (bytes.empty()) return absl::OkStatus();
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot write to '", temp_path_,
                                                 "' (temporary file for '", path_, "')"));
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("writer for '", path_, "' is already committed or abandoned"));
  }
  const auto fail = [this](const char* what) {
    const int err = errno;
    Abandon();
    return absl::ErrnoToStatus(err, absl::StrCat("cannot ", what, " '", temp_path_,
                                                 "' (temporary file for '", path_, "')"));
  };
  if (std::fflush(file_) != 0) return fail("flush");
  if (::fsync(::fileno(file_)) != 0) return fail("fsync");
  // fclose can report a deferred write error (e.g. NFS); the file is closed either way.
  const int close_rc = std::fclose(file_);
  file_ = nullptr;
  if (close_rc != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    return absl::ErrnoToStatus(err, absl::StrCat("cannot close '", temp_path_,
                                                 "' (temporary file for '", path_, "')"));
  }
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_path_.c_str());
    return absl::ErrnoToStatus(
        err, absl::StrCat("cannot rename '", temp_path_, "' to '", path_, "'"));
  }
  return FsyncDirectory(DirectoryOf(path_), path_);
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes) {
  absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Open(path);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = writer->Append(bytes); !s.ok()) return s;
  return writer->Commit();
}

}  // namespace recal
