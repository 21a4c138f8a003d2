// A whole file mapped read-only into memory. Tensor files are sliced straight out of the
// mapping, so only the pages a batch touches are ever read, and the kernel may drop them
// again under memory pressure.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal::data {

class MappedFile {
 public:
  // Errors: NOT_FOUND (no such file), PERMISSION_DENIED, INVALID_ARGUMENT (a directory,
  // not a regular file, or empty); each names the path.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // Valid while this object lives. Truncating the file meanwhile makes reads of the lost
  // pages fault (SIGBUS): data files must not change while a job reads them.
  absl::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, void* data, size_t size);

  std::string path_;
  void* data_;
  size_t size_;
};

}  // namespace recal::data
