// The bytes of a tensor file (.npy, .safetensors), read by position: the seam that lets the
// same sources read a local file or an object in a bucket.
//
//  - A local file is memory-mapped (common/mapped_file.h), as it always was: mapped() is the
//    whole file, the parsers read the header in place and batches are narrowed straight out
//    of the mapping (no read() calls, no extra copy; only the pages a batch touches are read).
//  - An object in a bucket (object_storage.h: ObjectFile) has no mapping: the header is read
//    with one ranged read (two when it is longer than the first guess), then each batch's
//    rows with a ranged read of exactly those rows (server/data/sliced_source.h,
//    MakeRangedSource). The pipeline's prefetcher (server/data/prefetcher.h) runs Next()
//    ahead on its own thread, so the read of batch k+1 overlaps the forward pass of batch k;
//    nothing here reads ahead on its own.
//    In the server's sandboxed worker those reads go through the runner that started it
//    (server/worker/remote_objects.h), which alone holds the network and the credentials.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace recal::data {

class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;

  // The path, or s3://BUCKET/KEY: for messages and Describe().
  virtual const std::string& name() const = 0;
  virtual int64_t size() const = 0;

  // The whole file in memory, valid while this object lives (a local file's read-only
  // mapping), or nullptr for a file read by ranges.
  virtual const char* mapped() const { return nullptr; }

  // Exactly out.size() bytes from offset; offset + out.size() <= size(). Thread-safe.
  // Errors name the file.
  virtual absl::Status ReadAt(int64_t offset, absl::Span<char> out) const = 0;
};

// A local file, memory-mapped. Errors as MappedFile::Open's.
absl::StatusOr<std::shared_ptr<const RandomAccessFile>> OpenLocalFile(const std::string& path);

// The start of `file` through the end of its header, for a parser that takes the header
// alone: reads the first `first_read` bytes (or the whole file when shorter), asks
// `header_size` how long the header is, and reads the rest if the first read fell short
// (at most two reads). A header that claims more bytes than the file has yields what
// there is: the parser then reports the truncation.
template <typename HeaderSize>
absl::StatusOr<std::string> ReadFileHeader(const RandomAccessFile& file, int64_t first_read,
                                           const HeaderSize& header_size) {
  std::string bytes(static_cast<size_t>(std::min(first_read, file.size())), '\0');
  if (absl::Status s = file.ReadAt(0, absl::MakeSpan(bytes)); !s.ok()) return s;
  absl::StatusOr<int64_t> needed = header_size(bytes);
  if (!needed.ok()) return needed.status();
  const int64_t total = std::min(*needed, file.size());
  if (total > static_cast<int64_t>(bytes.size())) {
    const size_t have = bytes.size();
    bytes.resize(static_cast<size_t>(total));
    if (absl::Status s = file.ReadAt(static_cast<int64_t>(have), absl::MakeSpan(bytes).subspan(have)); !s.ok()) {
      return s;
    }
  }
  return bytes;
}

}  // namespace recal::data
