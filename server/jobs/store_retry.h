// The scheduler's one answer to a store that is away (restarting, say): the job is not at
// fault, so ask again rather than fail it with the store's error, for as long as the run
// still holds the job (its lease keeper turns a lease lost meanwhile into a cancel).
#pragma once

#include <chrono>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace recal::jobs {

inline const absl::Status& StatusOf(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

// `attempt()`, called again every 500 ms while it answers UNAVAILABLE and
// `keep_trying(that answer)` holds.
template <typename Attempt, typename KeepTrying>
auto RetryWhileUnavailable(Attempt attempt, KeepTrying keep_trying) {
  auto result = attempt();
  while (absl::IsUnavailable(StatusOf(result)) && keep_trying(StatusOf(result))) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    result = attempt();
  }
  return result;
}

}  // namespace recal::jobs
