#include "server/worker/channel.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl.h"
#include "google/protobuf/message_lite.h"
#include "google/protobuf/util/delimited_message_util.h"

namespace recal::worker {

MessageReader::MessageReader(int fd, int64_t max_message_bytes)
    : in_(std::make_unique<google::protobuf::io::FileInputStream>(fd)),
      max_message_bytes_(max_message_bytes) {}

MessageReader::~MessageReader() = default;

absl::StatusOr<bool> MessageReader::Read(google::protobuf::MessageLite* message) {
  // One CodedInputStream per message: it hands back what it buffered past the message.
  google::protobuf::io::CodedInputStream coded(in_.get());
  uint32_t size = 0;
  if (!coded.ReadVarint32(&size)) {
    if (in_->GetErrno() != 0) return absl::UnavailableError(absl::StrCat("read: ", std::strerror(in_->GetErrno())));
    return false;  // nothing more (a partial varint also ends here: the writer died)
  }
  if (size > max_message_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a message of ", size, " bytes exceeds the limit of ", max_message_bytes_));
  }
  coded.SetTotalBytesLimit(static_cast<int>(size) + 16);
  const auto limit = coded.PushLimit(static_cast<int>(size));
  message->Clear();
  if (!message->MergeFromCodedStream(&coded) || !coded.ConsumedEntireMessage() ||
      coded.BytesUntilLimit() != 0) {
    return absl::DataLossError("a truncated or malformed message");
  }
  coded.PopLimit(limit);
  return true;
}

absl::Status WriteMessage(int fd, const google::protobuf::MessageLite& message) {
  if (!google::protobuf::util::SerializeDelimitedToFileDescriptor(message, fd)) {
    return absl::FailedPreconditionError(absl::StrCat("write: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace recal::worker
