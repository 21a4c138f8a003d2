// The bytes of a tensor file (.npy, .safetensors), read by position: the seam that lets the
// same sources read a local file or an object in a bucket.
//
//  - A local file is memory-mapped (common/mapped_file.h), as it always was: mapped() is the
//    whole file, the parsers read the header in place and batches are narrowed straight out
//    of the mapping (no read() calls, no extra copy; only the pages a batch touches are read).
//  - An object in a bucket (s3_object_file.h) has no mapping: the header is read with one
//    ranged GET (two when it is longer than the first guess), then each batch's rows with a
//    ranged GET of exactly those rows (sliced_source.h, MakeRangedSource). The pipeline's
//    prefetcher (prefetcher.h) runs Next() ahead on its own thread, so the GET of batch k+1
//    overlaps the forward pass of batch k; nothing here reads ahead on its own.
//
// The server path (not built yet; the design the next stage implements). A job's forward
// pass runs in recal-worker under the sandbox (server/sandbox/sandbox.cc): its own network
// namespace, seccomp refusing every socket but AF_UNIX, Landlock on the data roots. Giving
// it an allowlisted route to the endpoint would put the S3 credentials inside the process
// that runs the uploaded, hostile model, and turn "no network" into a per-host firewall to
// keep right (DNS, redirects, IPv6). So the worker never talks to the endpoint: the
// parent, the trusted runner (server/jobs/worker_runner.cc), which already holds the
// configuration, fetches the bytes and serves them over the pipes it already has with the
// child (stdin: the Task, then pushed batches, written by the feeder thread; the events
// pipe: progress and the result, read by the runner's loop; server/worker/channel.h):
//   1. The runner resolves the spec (s3:// parsed strictly, roots checked) and, for a tensor
//      file, HEADs the object; the size and ETag go into the Task, the credentials do not.
//   2. In the child, RemoteFile implements this interface: ReadAt sends an Event
//      read_request {id, offset, length} up the events pipe and waits for the Input
//      read_reply {id, bytes | status} on stdin. The runner answers each request on a small
//      pool with one S3Client::ReadRange(..., if_match = ETag), checking it against the one
//      object it HEADed (offset + length <= size, length <= the channel's message limit):
//      the child can ask for ranges of that object, never name another. Replies and pushed
//      batches share stdin under one writer mutex (they never occur in one job together).
//   3. An image folder: the runner lists the prefix (the selection and order of
//      s3_sources.cc), sends the relative names in the Task, and serves whole objects by
//      index the same way; the child's decode window bounds the requests in flight.
//   4. Failures cross as statuses (NOT_FOUND, PERMISSION_DENIED, UNAVAILABLE after the
//      runner's bounded retries) and fail the job; the worker pool stays up.
// One process holds the credentials and the network; the sandbox keeps no network at all;
// the bytes cross one more pipe (GB/s, far above what a bucket serves); and the child runs
// the same sources as recal-run, over this interface.
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
