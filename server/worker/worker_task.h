// One task inside recal-worker, after the sandbox is entered: recalibrate a job, inspect an
// upload, or (tests) probe the sandbox. The only code that loads and runs an uploaded model.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "recal/worker/v1/worker.pb.h"
#include "server/worker/channel.h"

namespace recal::worker {

using EventSink = std::function<absl::Status(const v1::Event&)>;

struct TaskContext {
  std::string model;    // the archive: a path or "fd:N" (engine::kModelFdPrefix)
  std::string scratch;  // where the results are written
  MessageReader* input = nullptr;  // the pushed batches of a client-stream job
};

// Runs `task`; every outcome, failures included, is an event (the last one). The returned
// status is not OK only when an event could not be sent.
absl::Status RunTask(const v1::Task& task, const TaskContext& context, const EventSink& send);

}  // namespace recal::worker
