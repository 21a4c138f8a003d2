// What flows between the server and one recal-worker (worker_process.h), over pipes: the
// task and then pushed batches or replies to its reads into its stdin, its events out of
// descriptor 3, and its stderr, of which the last words are kept for the error that names
// why it failed. Each is pumped on its own thread, so that a worker that stops reading or
// writing one of them blocks none of the others.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "recal/worker/v1/worker.pb.h"
#include "server/jobs/fd.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/remote_reads.h"

namespace google::protobuf {
class MessageLite;
}  // namespace google::protobuf

namespace recal::jobs {

// A worker's pipes (the *_write ends of task and *_read ends of events and err are the
// server's) and the model it reads on descriptor 4.
struct WorkerPipes {
  // No model (-1 descriptor) when `model_path` is empty.
  static absl::StatusOr<WorkerPipes> Open(const std::string& model_path);
  // The child's descriptors: 0 the task, 1 and 2 stderr, 3 events, 4 the model if any.
  std::vector<int> ChildDescriptors() const;
  // Once the child has them: the server keeps only its own ends, so that the worker's exit
  // ends the reads.
  void CloseChildEnds();

  Fd task_read, task_write, events_read, events_write, err_read, err_write, model;
};

// The worker's stdin: the task, then pushed batches (written by the feeder) or replies to its
// reads (by the RemoteReads threads), one message at a time. Thread-safe.
class WorkerInput {
 public:
  explicit WorkerInput(Fd fd) : fd_(std::move(fd)) {}
  // FAILED_PRECONDITION once closed, or once the worker is gone.
  absl::Status Write(const google::protobuf::MessageLite& message);
  // Says nothing more comes.
  void Close();

 private:
  std::mutex mu_;
  Fd fd_;
};

// Writes `task` into `input`, then the job's pushed batches as hooks.next_pushed() gives them,
// until the last, on its own thread. Then closes the input, unless `close_when_fed` is false
// (replies to the worker's reads may still come). `input`, `task` and `hooks` must outlive it.
class TaskFeeder {
 public:
  TaskFeeder(WorkerInput& input, const worker::v1::Task& task, const RunHooks& hooks, bool close_when_fed);
  ~TaskFeeder();
  TaskFeeder(const TaskFeeder&) = delete;
  TaskFeeder& operator=(const TaskFeeder&) = delete;

  // The run is over: releases a next_pushed() still waiting for the client (its feed is
  // closed) and joins. Why the feed stopped before the job ended (a client that stopped
  // pushing), if it did: the job's error, rather than the worker's view of it (its input
  // ended early).
  absl::Status Finish();

 private:
  void Feed(const worker::v1::Task& task, bool close_when_fed);

  WorkerInput& input_;
  const RunHooks& hooks_;
  absl::Status feed_error_;
  std::atomic<bool> releasing_{false};
  std::thread thread_;
};

// Keeps the last few KiB a worker writes on stderr, read on its own thread until it closes it.
class StderrTail {
 public:
  explicit StderrTail(Fd fd);
  ~StderrTail() { Join(); }
  StderrTail(const StderrTail&) = delete;
  StderrTail& operator=(const StderrTail&) = delete;

  // Waits for the end of the worker's stderr; its last line.
  std::string LastWords();

 private:
  void Join();

  const Fd fd_;
  std::string tail_;
  std::thread thread_;
};

// What a worker does besides its last event, as the pump meets it.
struct WorkerEventHandlers {
  std::function<void(const worker::v1::Sandboxed&)> on_sandboxed;  // may be empty
  std::function<void(const worker::v1::Progress&)> on_progress;    // until the last event; may be empty
  RemoteReads* reads = nullptr;  // null: a read request breaks the protocol
};

struct WorkerEvents {
  std::optional<worker::v1::Event> last;  // its first event of any other kind (report, layers, failure...)
  absl::Status protocol;                  // not OK: the worker broke the protocol, and the pump stopped
};

// Reads the worker's events from `events_fd` until it closes it or breaks the protocol.
WorkerEvents PumpEvents(int events_fd, const WorkerEventHandlers& handlers);

// Reads what a process prints on `out` and `err` (the last few KiB or more of each) until it
// closes both, or until `deadline`: false if the deadline came first.
absl::StatusOr<bool> ReadUntilClosed(const Fd& out, const Fd& err, absl::Time deadline, std::string* out_text,
                                     std::string* err_text);

// The last line of `text`, without its line end.
std::string LastLine(std::string text);

}  // namespace recal::jobs
