// Length-delimited protobuf messages over a file descriptor: the server and recal-worker
// talk this way over pipes (proto/recal/worker/v1/worker.proto). Neither end trusts the
// other's sizes: a message over the limit is an error, not an allocation.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace google::protobuf {
class MessageLite;
namespace io {
class FileInputStream;
}
}  // namespace google::protobuf

namespace recal::worker {

// The largest range one ReadRequest asks for (data in a bucket, read through the server):
// a larger read is split (a batch of 32 images of 3x224x224 float32 is 19 MB), and the
// server refuses more. Keeps each reply far below the channel's message limits.
inline constexpr int64_t kMaxReadRequestBytes = int64_t{8} << 20;

class MessageReader {
 public:
  MessageReader(int fd, int64_t max_message_bytes);
  ~MessageReader();

  // True with a message, false at a clean end of the stream (between messages); an error
  // for a truncated, oversized or malformed one.
  absl::StatusOr<bool> Read(google::protobuf::MessageLite* message);

 private:
  std::unique_ptr<google::protobuf::io::FileInputStream> in_;
  const int64_t max_message_bytes_;
};

// Writes one message (blocking). FAILED_PRECONDITION once the reader has gone.
absl::Status WriteMessage(int fd, const google::protobuf::MessageLite& message);

}  // namespace recal::worker
