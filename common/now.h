// The current time as a protobuf Timestamp (and the seconds between two), to the resolution of the clock. Not protobuf
// 3.21's TimeUtil::GetCurrentTime: on this platform it gives whole seconds, which made job
// durations and queue waits whole seconds too.
#pragma once

#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"

namespace recal {

inline google::protobuf::Timestamp NowTimestamp() {
  const int64_t nanos = absl::ToInt64Nanoseconds(absl::Now() - absl::UnixEpoch());
  google::protobuf::Timestamp now;
  now.set_seconds(nanos / 1000000000);
  now.set_nanos(static_cast<int32_t>(nanos % 1000000000));
  return now;
}

// Seconds from `from` to `to` (negative when `to` is earlier).
inline double SecondsBetween(const google::protobuf::Timestamp& from, const google::protobuf::Timestamp& to) {
  return static_cast<double>(to.seconds() - from.seconds()) + (to.nanos() - from.nanos()) / 1e9;
}

}  // namespace recal
