// A client's PushBatches stream as the API adapter drives it, whichever way the batches go:
// into a feed of this process (role all), or relayed to the worker process that runs the job
// (cluster mode, server/relay). The adapter opens one at the stream's first message
// (JobManager::OpenPush), hands it every message, and finishes it when the client is done.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"

namespace recal::jobs {

class PushStream {
 public:
  virtual ~PushStream() = default;
  // Delivers one message; blocks while the job's feed is full (back-pressure). An error ends
  // the stream. `message` may be taken apart (moved on without a copy).
  virtual absl::Status Push(v1::PushBatchesRequest& message) = 0;
  // The client ended its stream (or went away): the stream's outcome.
  virtual absl::Status Finish() = 0;
};

// Carries pushed batches to the worker process that runs a job (cluster mode).
class PushRelay {
 public:
  virtual ~PushRelay() = default;
  // A stream to the worker process at `address` (read from the store, as that process wrote
  // it) feeding the job or shard `feed_id`.
  virtual absl::StatusOr<std::unique_ptr<PushStream>> Open(const std::string& address,
                                                           const std::string& feed_id) = 0;
  // Shutdown: every open stream's call is cancelled (a push blocked on a full feed returns),
  // and Open refuses from now on.
  virtual void CloseAll() = 0;
};

}  // namespace recal::jobs
