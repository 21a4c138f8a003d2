// Issue 35: many WatchJob streams on one recal-server. Starts the real server, uploads a
// small fixture model, submits one client_stream job (it waits, RUNNING, for batches this
// bench pushes at the end), opens --watchers WatchJob streams over --channels connections
// with gRPC's callback client, samples the server's threads (/proc/PID/status Threads) and
// RSS while they wait, then pushes the batches and times until the last watcher has seen the
// job's end. Prints one table; exits 1 if the server used --max_threads threads or more, or
// if any watcher missed the end.
//
//   build/bin/watch_streams_bench [--watchers 10000] [--channels 16] [--hold_seconds 5]
//       [--fixtures build/fixtures] [--store sqlite|postgresql]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/command_line.h"
#include "tests/server/calls.h"
#include "tests/server/process_stats.h"
#include "tests/server/server_process.h"
#include "tests/store/postgres_server.h"
#include "tests/test_util.h"

ABSL_FLAG(int, watchers, 10000, "WatchJob streams open at once on the job");
ABSL_FLAG(int, channels, 16, "client connections the streams are spread over");
ABSL_FLAG(double, hold_seconds, 5, "how long every watcher waits, sampled, before the job is fed");
ABSL_FLAG(int, max_threads, 200, "the server's thread bound (issue 35): at or above it the bench fails");
ABSL_FLAG(double, open_timeout_seconds, 300, "give up when not every watcher has its first event by then");
ABSL_FLAG(std::string, fixtures, "build/fixtures", "the fixtures directory (bn1d_2d model)");
ABSL_FLAG(std::string, store, "sqlite",
          "the server's metadata store: sqlite (in its data directory) or postgresql (a throwaway "
          "PostgreSQL on loopback, as the tests start one)");

namespace {

using recal::v1::JobEvent;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }
double Mib(int64_t bytes) { return bytes / 1048576.0; }
int64_t WallNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// What the watchers have seen, together.
struct Tally {
  std::atomic<int> opened{0};          // had their first event (the snapshot)
  std::atomic<int> done{0};            // ended, any status
  std::atomic<int> saw_end{0};         // ended OK after the job's terminal state
  std::atomic<int64_t> last_done_ns{0};  // wall clock of the last end
};

// One watcher: reads until the stream ends; counts itself in the tally.
class Watcher final : public grpc::ClientReadReactor<JobEvent> {
 public:
  Watcher(recal::v1::Recal::Stub* stub, const std::string& job_id, Tally* tally) : tally_(tally) {
    request_.set_id(job_id);
    stub->async()->WatchJob(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    if (!opened_) tally_->opened.fetch_add(1);
    opened_ = true;
    if (event_.kind_case() == JobEvent::kState &&
        (event_.state() == recal::v1::SUCCEEDED || event_.state() == recal::v1::FAILED ||
         event_.state() == recal::v1::CANCELLED)) {
      terminal_ = true;
    }
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& status) override {
    if (status.ok() && terminal_) tally_->saw_end.fetch_add(1);
    const int64_t now = WallNanos();
    int64_t last = tally_->last_done_ns.load();
    while (now > last && !tally_->last_done_ns.compare_exchange_weak(last, now)) {
    }
    tally_->done.fetch_add(1);
  }

 private:
  Tally* const tally_;
  grpc::ClientContext context_;
  recal::v1::WatchJobRequest request_;
  JobEvent event_;
  bool opened_ = false;
  bool terminal_ = false;
};

// Four batches of 8 samples of 12 floats: what bn1d_2d takes.
std::vector<recal::v1::Tensor> Batches() {
  std::vector<recal::v1::Tensor> batches(4);
  for (size_t b = 0; b < batches.size(); ++b) {
    std::vector<float> values(8 * 12);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>((i * 7 + b * 3) % 11) - 5.0f;
    batches[b].set_dtype(recal::v1::Tensor::FLOAT32);
    batches[b].add_shape(8);
    batches[b].add_shape(12);
    batches[b].set_data(recal::testing::BytesOf(values));
  }
  return batches;
}

int Fail(const std::string& why) {
  std::fprintf(stderr, "watch_streams_bench: %s\n", why.c_str());
  return 2;
}

// The bn1d_2d fixture uploaded and a client_stream job on it submitted, RUNNING: it waits
// for the batches this bench pushes.
absl::StatusOr<recal::v1::Job> StartWaitingJob(recal::v1::Recal::Stub& stub, const std::string& fixtures) {
  recal::v1::Model model;
  const grpc::Status uploaded =
      recal::testing::Upload(stub, recal::testing::ReadBytes(fixtures + "/models/bn1d_2d.traced_train.pt"), &model);
  if (!uploaded.ok()) return absl::UnavailableError("upload: " + uploaded.error_message());
  recal::v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id(model.id());
  request.mutable_spec()->set_batch_size(8);
  request.mutable_spec()->mutable_data()->mutable_client_stream();
  recal::v1::Job job;
  grpc::ClientContext context;
  const grpc::Status submitted = stub.SubmitJob(&context, request, &job);
  if (!submitted.ok()) return absl::UnavailableError("submit: " + submitted.error_message());
  return recal::testing::WaitForState(stub, job.id(), recal::v1::RUNNING, 60);
}

// `count` stubs, each on a connection of its own (a local subchannel pool), sending the token.
std::vector<std::unique_ptr<recal::v1::Recal::Stub>> Stubs(const recal::testing::ServerProcess& server, int count) {
  std::vector<std::unique_ptr<recal::v1::Recal::Stub>> stubs;
  for (int c = 0; c < count; ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    stubs.push_back(recal::v1::Recal::NewStub(
        recal::testing::ChannelWithToken(server.target(), server.token(), nullptr, args)));
  }
  return stubs;
}

struct Measured {
  int watchers = 0, channels = 0, opened = 0, open_while_waiting = 0, saw_end = 0;
  int threads_before = 0, threads_waiting = 0, threads_max = 0;
  int64_t rss_before = 0, rss_waiting = 0, rss_max = 0;
  double open_seconds = 0, end_to_last = 0, push_to_last = 0;
};

void Print(const Measured& m) {
  std::printf("| watchers | channels | server threads: before / max while waiting / max | server RSS: before / max "
              "| all open after | job end -> last watcher's end | push -> last end | every watcher saw the end |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::printf("| %d (%d opened, %d open while waiting) | %d | %d / %d / %d | %.0f / %.0f MiB | %.2f s | %.2f s "
              "| %.2f s | %s (%d of %d) |\n",
              m.watchers, m.opened, m.open_while_waiting, m.channels, m.threads_before, m.threads_waiting,
              m.threads_max, Mib(m.rss_before), Mib(m.rss_max), m.open_seconds, m.end_to_last, m.push_to_last,
              m.saw_end == m.watchers ? "yes" : "no", m.saw_end, m.watchers);
  std::printf("RSS while waiting at most %.0f MiB (%.1f KiB a watcher above the start)\n", Mib(m.rss_waiting),
              (m.rss_waiting - m.rss_before) / 1024.0 / std::max(1, m.watchers));
}

// A database on the binary's throwaway PostgreSQL.
absl::StatusOr<std::string> NewPostgresDatabase() {
  absl::StatusOr<recal::testing::PostgresServer*> postgres = recal::testing::PostgresServer::Shared();
  if (!postgres.ok()) return postgres.status();
  return (*postgres)->NewDatabase();
}

}  // namespace

int main(int argc, char** argv) {
  recal::ParseCommandLineOrExit(argc, argv, "watch_streams_bench", "watch_streams_bench: many WatchJob streams on one recal-server: its threads, memory and the last watcher's delay");
  Measured m;
  m.watchers = absl::GetFlag(FLAGS_watchers);
  m.channels = std::max(1, absl::GetFlag(FLAGS_channels));
  const std::string fixtures = absl::GetFlag(FLAGS_fixtures);
  recal::testing::TempDir tmp;
  std::vector<std::string> flags = {"--data_root=" + fixtures, "--threads_per_worker=1"};
  const std::string store = absl::GetFlag(FLAGS_store);
  if (store == "postgresql") {
    absl::StatusOr<std::string> uri = NewPostgresDatabase();
    if (!uri.ok()) return Fail(std::string(uri.status().message()));
    flags.push_back("--store=" + *uri);
  } else if (store != "sqlite") {
    return Fail("--store must be sqlite or postgresql, not " + store);
  }
  recal::testing::ServerProcess server(tmp.File("data"), flags);
  if (!server.ok()) return Fail("the server did not start:\n" + server.log());
  auto stub = server.Stub();
  const absl::StatusOr<recal::v1::Job> job = StartWaitingJob(*stub, fixtures);
  if (!job.ok()) return Fail(std::string(job.status().message()));

  const pid_t pid = server.pid();
  m.threads_before = recal::testing::ThreadsOf(pid);
  m.rss_before = recal::testing::ResidentBytesOf(pid);
  std::atomic<int> threads_max{0};
  std::atomic<int64_t> rss_max{0};
  recal::testing::PeriodicSampler sampler(std::chrono::milliseconds(50), [&] {
    threads_max.store(std::max(threads_max.load(), recal::testing::ThreadsOf(pid)));
    rss_max.store(std::max(rss_max.load(), recal::testing::ResidentBytesOf(pid)));
  });

  const auto stubs = Stubs(server, m.channels);
  Tally tally;
  std::vector<std::unique_ptr<Watcher>> open;
  const auto open_start = Clock::now();
  for (int i = 0; i < m.watchers; ++i) {
    open.push_back(std::make_unique<Watcher>(stubs[i % m.channels].get(), job->id(), &tally));
  }
  while (tally.opened.load() + tally.done.load() < m.watchers &&
         Seconds(open_start) < absl::GetFlag(FLAGS_open_timeout_seconds)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  m.open_seconds = Seconds(open_start);
  m.opened = tally.opened.load();
  std::this_thread::sleep_for(std::chrono::duration<double>(absl::GetFlag(FLAGS_hold_seconds)));
  m.threads_waiting = threads_max.load();
  m.rss_waiting = rss_max.load();
  m.open_while_waiting = m.watchers - tally.done.load();

  const auto push_start = Clock::now();
  const grpc::Status pushed = recal::testing::PushAll(*stub, job->id(), 0, Batches());
  if (!pushed.ok()) return Fail("push: " + pushed.error_message());
  while (tally.done.load() < m.watchers && Seconds(push_start) < 300) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  m.push_to_last = Seconds(push_start);
  sampler.Stop();
  m.threads_max = threads_max.load();
  m.rss_max = rss_max.load();
  const recal::v1::Job ended = recal::testing::WaitForState(*stub, job->id(), recal::v1::SUCCEEDED, 60);
  const int64_t end_ns = ended.end_time().seconds() * 1000000000 + ended.end_time().nanos();
  m.end_to_last = (tally.last_done_ns.load() - end_ns) / 1e9;
  m.saw_end = tally.saw_end.load();
  Print(m);

  if (tally.done.load() == m.watchers) {
    open.clear();
  } else {
    for (auto& watcher : open) watcher.release();  // calls still in flight: left to the exit
  }
  if (m.threads_max >= absl::GetFlag(FLAGS_max_threads)) {
    return Fail(
        absl::StrCat("the server ran ", m.threads_max, " threads (bound ", absl::GetFlag(FLAGS_max_threads), ")"));
  }
  if (m.saw_end != m.watchers) return Fail("not every watcher saw the end");
  return 0;
}
