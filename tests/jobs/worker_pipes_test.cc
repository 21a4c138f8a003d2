// What flows through a worker's pipes, over real pipes with no worker: the task and the
// pushed batches in, the input closed when fed, a feed's failure kept as the job's, the
// events pumped (the last kept, progress until it), a broken protocol said, and the last
// words of a long stderr.
#include "server/jobs/worker_pipes.h"

#include <unistd.h>

#include <deque>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "server/worker/channel.h"

namespace recal::jobs {
namespace {

namespace wire = worker::v1;
using ::testing::HasSubstr;

struct TestPipe {
  TestPipe() { EXPECT_TRUE(Pipe(read, write).ok()); }
  Fd read, write;
};

wire::PushedBatch Batch(bool last) {
  wire::PushedBatch batch;
  batch.set_last(last);
  return batch;
}

TEST(TaskFeeder, WritesTheTaskThenTheBatchesUntilTheLastAndClosesTheInput) {
  TestPipe pipe;
  WorkerInput input(std::move(pipe.write));
  wire::Task task;
  task.mutable_inspect();
  std::deque<wire::PushedBatch> batches = {Batch(false), Batch(true), Batch(false)};
  RunHooks hooks;
  hooks.next_pushed = [&]() -> absl::StatusOr<std::optional<wire::PushedBatch>> {
    wire::PushedBatch next = batches.front();
    batches.pop_front();
    return next;
  };
  TaskFeeder feeder(input, task, hooks, /*close_when_fed=*/true);

  worker::MessageReader reader(pipe.read.get(), 1 << 20);
  wire::Task written;
  ASSERT_TRUE(*reader.Read(&written));
  EXPECT_TRUE(written.has_inspect());
  wire::PushedBatch batch;
  ASSERT_TRUE(*reader.Read(&batch));
  EXPECT_FALSE(batch.last());
  ASSERT_TRUE(*reader.Read(&batch));
  EXPECT_TRUE(batch.last());
  EXPECT_FALSE(*reader.Read(&batch));  // closed after the last
  EXPECT_TRUE(feeder.Finish().ok());
  EXPECT_EQ(batches.size(), 1u);
}

TEST(TaskFeeder, LeavesTheInputOpenForRepliesWhenAsked) {
  TestPipe pipe;
  WorkerInput input(std::move(pipe.write));
  const wire::Task task;
  RunHooks hooks;
  TaskFeeder feeder(input, task, hooks, /*close_when_fed=*/false);
  EXPECT_TRUE(feeder.Finish().ok());
  EXPECT_TRUE(input.Write(wire::ReadReply()).ok());
  input.Close();
  EXPECT_EQ(input.Write(wire::ReadReply()).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TaskFeeder, AFeedThatFailsIsTheJobsErrorButOneReleasedAtTheEndIsNot) {
  TestPipe pipe;
  WorkerInput input(std::move(pipe.write));
  RunHooks failing;
  failing.next_pushed = []() -> absl::StatusOr<std::optional<wire::PushedBatch>> {
    return absl::AbortedError("the client stopped pushing");
  };
  const wire::Task task;
  TaskFeeder broken(input, task, failing, /*close_when_fed=*/true);
  // The feed failed before the run was over: once its input is closed, the feeder is done.
  worker::MessageReader reader(pipe.read.get(), 1 << 20);
  wire::Task written;
  ASSERT_TRUE(*reader.Read(&written));
  EXPECT_FALSE(*reader.Read(&written));
  EXPECT_EQ(broken.Finish(), absl::AbortedError("the client stopped pushing"));

  TestPipe open_pipe;
  WorkerInput open_input(std::move(open_pipe.write));

  std::atomic<bool> released{false};
  RunHooks waiting;
  waiting.next_pushed = [&]() -> absl::StatusOr<std::optional<wire::PushedBatch>> {
    while (!released) absl::SleepFor(absl::Milliseconds(5));
    return absl::CancelledError("released");
  };
  waiting.release_pushed = [&] { released = true; };
  TaskFeeder feeder(open_input, task, waiting, /*close_when_fed=*/false);
  EXPECT_TRUE(feeder.Finish().ok());
}

void WriteEvent(const Fd& fd, const wire::Event& event) { ASSERT_TRUE(worker::WriteMessage(fd.get(), event).ok()); }

TEST(PumpEvents, KeepsTheFirstLastEventAndProgressUntilIt) {
  TestPipe pipe;
  wire::Event event;
  event.mutable_sandboxed()->add_enforced("seccomp");
  WriteEvent(pipe.write, event);
  event.mutable_progress()->set_batches(1);
  WriteEvent(pipe.write, event);
  event.mutable_layers();
  WriteEvent(pipe.write, event);
  event.mutable_progress()->set_batches(2);
  WriteEvent(pipe.write, event);
  event.mutable_failure()->set_message("late");
  WriteEvent(pipe.write, event);
  pipe.write.reset();

  std::vector<std::string> seen;
  WorkerEvents events = PumpEvents(
      pipe.read.get(),
      {.on_sandboxed = [&](const wire::Sandboxed& s) { seen.push_back("sandboxed " + s.enforced(0)); },
       .on_progress = [&](const wire::Progress& p) { seen.push_back(absl::StrCat("progress ", p.batches())); }});
  EXPECT_TRUE(events.protocol.ok()) << events.protocol;
  ASSERT_TRUE(events.last.has_value());
  EXPECT_TRUE(events.last->has_layers());
  EXPECT_THAT(seen, ::testing::ElementsAre("sandboxed seccomp", "progress 1"));
}

TEST(PumpEvents, AReadRequestOfATaskWithoutBucketDataBreaksTheProtocol) {
  TestPipe pipe;
  wire::Event event;
  event.mutable_read_request()->set_length(1);
  WriteEvent(pipe.write, event);
  event.mutable_layers();
  WriteEvent(pipe.write, event);
  pipe.write.reset();
  WorkerEvents events = PumpEvents(pipe.read.get(), {});
  EXPECT_EQ(events.protocol.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(events.protocol.message(), HasSubstr("does not have"));
  EXPECT_FALSE(events.last.has_value());  // the pump stopped there
}

TEST(PumpEvents, ATruncatedEventBreaksTheProtocol) {
  TestPipe pipe;
  ASSERT_EQ(::write(pipe.write.get(), "\x0a" "abc", 4), 4);  // 10 bytes announced, 3 sent
  pipe.write.reset();
  EXPECT_EQ(PumpEvents(pipe.read.get(), {}).protocol.code(), absl::StatusCode::kDataLoss);
}

TEST(StderrTail, KeepsTheLastWordsOfALongOutput) {
  TestPipe pipe;
  StderrTail tail(std::move(pipe.read));
  const std::string noise(100000, 'x');
  ASSERT_EQ(::write(pipe.write.get(), noise.data(), noise.size()), static_cast<ssize_t>(noise.size()));
  ASSERT_EQ(::write(pipe.write.get(), "\nout of memory\n\n", 16), 16);
  pipe.write.reset();
  EXPECT_EQ(tail.LastWords(), "out of memory");
}

TEST(LastLine, IsTheLastLineWithoutItsEnd) {
  EXPECT_EQ(LastLine("a\nb\r\n"), "b");
  EXPECT_EQ(LastLine("only"), "only");
  EXPECT_EQ(LastLine(""), "");
}

}  // namespace
}  // namespace recal::jobs
