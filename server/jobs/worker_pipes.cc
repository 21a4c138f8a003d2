#include "server/jobs/worker_pipes.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/cleanup/cleanup.h"
#include "common/status_macros.h"
#include "google/protobuf/message_lite.h"
#include "server/worker/channel.h"

namespace recal::jobs {
namespace {

namespace wire = worker::v1;

constexpr int64_t kMaxEventBytes = int64_t{64} << 20;
constexpr size_t kStderrTail = 4096;

// Appends what was read to `tail`, keeping its last kStderrTail bytes or more.
void AppendToTail(std::string& tail, const char* data, size_t size) {
  tail.append(data, size);
  if (tail.size() > 2 * kStderrTail) tail.erase(0, tail.size() - kStderrTail);
}

}  // namespace

absl::StatusOr<WorkerPipes> WorkerPipes::Open(const std::string& model_path) {
  WorkerPipes pipes;
  RECAL_RETURN_IF_ERROR(Pipe(pipes.task_read, pipes.task_write));
  RECAL_RETURN_IF_ERROR(Pipe(pipes.events_read, pipes.events_write));
  RECAL_RETURN_IF_ERROR(Pipe(pipes.err_read, pipes.err_write));
  if (!model_path.empty()) {
    RECAL_ASSIGN_OR_RETURN(pipes.model, OpenForReading(model_path, "the model"));
  }
  return pipes;
}

std::vector<int> WorkerPipes::ChildDescriptors() const {
  std::vector<int> descriptors = {task_read.get(), err_write.get(), err_write.get(), events_write.get()};
  if (model.get() >= 0) descriptors.push_back(model.get());
  return descriptors;
}

void WorkerPipes::CloseChildEnds() {
  task_read.reset();
  events_write.reset();
  err_write.reset();
  model.reset();
}

absl::Status WorkerInput::Write(const google::protobuf::MessageLite& message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_.get() < 0) return absl::FailedPreconditionError("the worker's input is closed");
  return worker::WriteMessage(fd_.get(), message);
}

void WorkerInput::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  fd_.reset();
}

TaskFeeder::TaskFeeder(WorkerInput& input, const wire::Task& task, const RunHooks& hooks, bool close_when_fed)
    : input_(input), hooks_(hooks), thread_([this, &task, close_when_fed] { Feed(task, close_when_fed); }) {}

TaskFeeder::~TaskFeeder() {
  if (thread_.joinable()) Finish().IgnoreError();
}

void TaskFeeder::Feed(const wire::Task& task, bool close_when_fed) {
  absl::Cleanup close_input = [&] {
    if (close_when_fed) input_.Close();
  };
  if (!input_.Write(task).ok()) return;
  if (!hooks_.next_pushed) return;
  while (true) {
    auto batch = hooks_.next_pushed();
    if (!batch.ok() && !releasing_) feed_error_ = batch.status();
    if (!batch.ok() || !batch->has_value()) return;
    if (!input_.Write(**batch).ok()) return;
    if ((*batch)->last()) return;
  }
}

absl::Status TaskFeeder::Finish() {
  releasing_ = true;
  if (hooks_.release_pushed) hooks_.release_pushed();
  if (thread_.joinable()) thread_.join();
  return feed_error_;
}

StderrTail::StderrTail(Fd fd)
    : fd_(std::move(fd)), thread_([this] {
        char buffer[4096];
        while (true) {
          const ssize_t got = ::read(fd_.get(), buffer, sizeof(buffer));
          if (got < 0 && errno == EINTR) continue;
          if (got <= 0) break;
          AppendToTail(tail_, buffer, static_cast<size_t>(got));
        }
      }) {}

void StderrTail::Join() {
  if (thread_.joinable()) thread_.join();
}

std::string StderrTail::LastWords() {
  Join();
  return LastLine(tail_);
}

WorkerEvents PumpEvents(int events_fd, const WorkerEventHandlers& handlers) {
  WorkerEvents pumped;
  worker::MessageReader events(events_fd, kMaxEventBytes);
  while (pumped.protocol.ok()) {
    wire::Event event;
    absl::StatusOr<bool> read = events.Read(&event);
    if (!read.ok()) {
      pumped.protocol = read.status();
      break;
    }
    if (!*read) break;
    switch (event.kind_case()) {
      case wire::Event::kSandboxed:
        if (handlers.on_sandboxed) handlers.on_sandboxed(event.sandboxed());
        break;
      case wire::Event::kProgress:
        if (handlers.on_progress && !pumped.last) handlers.on_progress(event.progress());
        break;
      case wire::Event::kReadRequest:
        if (handlers.reads == nullptr) {
          pumped.protocol = absl::InvalidArgumentError("it asked to read data in a bucket that its task does not have");
          break;
        }
        handlers.reads->Serve(event.read_request());
        break;
      default:
        if (!pumped.last) pumped.last = std::move(event);
    }
  }
  return pumped;
}

absl::StatusOr<bool> ReadUntilClosed(const Fd& out, const Fd& err, absl::Time deadline, std::string* out_text,
                                     std::string* err_text) {
  pollfd fds[2] = {{out.get(), POLLIN, 0}, {err.get(), POLLIN, 0}};
  std::string* into[2] = {out_text, err_text};
  while (fds[0].fd >= 0 || fds[1].fd >= 0) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return false;
    if (::poll(fds, 2, static_cast<int>(std::min<int64_t>(left_ms, 1000))) < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, "poll");
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t got = ::read(fds[i].fd, buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        fds[i].fd = -1;  // poll() skips negative descriptors
        continue;
      }
      AppendToTail(*into[i], buffer, static_cast<size_t>(got));
    }
  }
  return true;
}

std::string LastLine(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const size_t cut = text.find_last_of('\n');
  return cut == std::string::npos ? text : text.substr(cut + 1);
}

}  // namespace recal::jobs
