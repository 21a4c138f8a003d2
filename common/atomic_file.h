// Files that appear whole or not at all: readers (and a crash) never see a half-written
// file under the final name. Bytes go to a temporary file in the same directory, which is
// flushed, fsync'ed and renamed over the target; the directory is fsync'ed so the rename
// itself survives a power loss.
#pragma once

#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal {

// Replaces (or creates) `path` with `bytes`, atomically and durably.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes);

// Streaming form, for contents too large to assemble in memory first:
//
//   ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
//   RETURN_IF_ERROR(w.Append(header));
//   RETURN_IF_ERROR(w.Append(body));
//   RETURN_IF_ERROR(w.Commit());
//
// The temporary file is `<path>.tmp.<pid>.<random hex>`. A writer destroyed without a
// successful Commit() removes it, so an error path (or an early return) leaves the target
// untouched and no litter behind. Not thread-safe.
class AtomicFileWriter {
 public:
  static absl::StatusOr<AtomicFileWriter> Open(const std::string& path);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  absl::Status Append(absl::string_view bytes);

  // Flushes, fsyncs, renames over the target and fsyncs the directory. After it returns
  // (successfully or not) the writer is finished: on failure the temporary file is gone
  // and the target is as it was (unless only the final directory fsync failed, in which
  // case the new contents are in place but may not survive a crash).
  absl::Status Commit();

  // Drops the temporary file now instead of at destruction. Idempotent.
  void Abandon();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  AtomicFileWriter(std::string path, std::string temp_path, std::FILE* file);

  std::string path_;
  std::string temp_path_;
  std::FILE* file_ = nullptr;  // null once committed or abandoned
};

}  // namespace recal
