// The control plane on SQLite and on PostgreSQL, side by side in one run: SubmitJob and
// GetJob calls per second through an api process (no workers: the store is all they touch),
// from one client and from --clients at once, tiny jobs per second end to end with two
// workers, and the failover time of a job whose worker is killed (kill -9 to RUNNING again on
// the other worker). PostgreSQL runs twice: with one connection per process
// (--store_connections=1, as before the pool) and with the default pool. PostgreSQL is a
// throwaway server started here (fsync off, as in the tests: this compares the code paths,
// not the disks). Prints one table.
//
//   build/bin/control_plane_bench [--jobs 24] [--calls 400] [--clients 8] [--lease_seconds 3]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/command_line.h"
#include "tests/server/calls.h"
#include "tests/server/server_process.h"
#include "server/store/metadata_store.h"
#include "tests/store/postgres_server.h"
#include "tests/test_util.h"

ABSL_FLAG(int, jobs, 24, "tiny jobs per configuration");
ABSL_FLAG(int, calls, 400, "SubmitJob and GetJob calls per configuration");
ABSL_FLAG(int, clients, 8, "client threads calling at once in the concurrent phase");
ABSL_FLAG(int, lease_seconds, 3, "the workers' lease (failover waits for it to run out)");
ABSL_FLAG(std::string, fixtures, "build/fixtures", "the fixtures directory (bn1d_2d model and data)");

namespace {

using recal::testing::ServerProcess;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

struct Row {
  double submits_per_s = 0, gets_per_s = 0, concurrent_submits_per_s = 0, concurrent_gets_per_s = 0,
         jobs_per_s = 0, failover_s = 0;
};

class Cluster {
 public:
  Cluster(const std::string& dir, const std::string& store, int connections, int workers, int lease_seconds)
      : token_(recal::testing::NewToken()) {
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/auth.txt") << recal::testing::AuthLine(token_, "default", "admin");
    // Cluster mode's shared secret: api replicas have workers inspect their uploads.
    std::ofstream(dir + "/internal_token") << recal::testing::NewToken() << "\n";
    const std::vector<std::string> shared = {"--internal_token_file=" + dir + "/internal_token",
                                             "--store=" + store, "--blobs=file:" + dir + "/blobs",
                                             "--data_root=" + absl::GetFlag(FLAGS_fixtures),
                                             "--auth_file=" + dir + "/auth.txt",
                                             absl::StrCat("--store_connections=", connections),
                                             "--max_queued_jobs=1000000",  // the calls queue thousands
                                             absl::StrCat("--lease_seconds=", lease_seconds)};
    auto flags = shared;
    flags.push_back("--role=api");
    api_ = std::make_unique<ServerProcess>(dir + "/api", flags, ServerProcess::Auth::kOpen);
    for (int i = 0; i < workers; ++i) {
      flags = shared;
      flags.insert(flags.end(), {"--role=worker", "--internal_listen=127.0.0.1:0"});
      workers_.push_back(std::make_unique<ServerProcess>(absl::StrCat(dir, "/worker", i), flags,
                                                         ServerProcess::Auth::kOpen));
    }
  }
  // Says on stderr which process did not start, with its log.
  bool ok() const {
    for (const auto& w : workers_) {
      if (!w->ok()) return Failed("a worker", *w);
    }
    return api_->ok() || Failed("the api process", *api_);
  }
  static bool Failed(const char* which, const ServerProcess& process) {
    std::fprintf(stderr, "control_plane_bench: %s did not start:\n%s\n", which, process.log().c_str());
    return false;
  }
  std::unique_ptr<recal::v1::Recal::Stub> Stub() const { return api_->Stub(token_); }
  std::vector<std::unique_ptr<ServerProcess>>& workers() { return workers_; }

 private:
  std::string token_;
  std::unique_ptr<ServerProcess> api_;
  std::vector<std::unique_ptr<ServerProcess>> workers_;
};

// `calls` calls of `call` (which returns its status) split between `clients` threads, each
// with its own channel: successful calls/s; 0 if any failed (the first failure on stderr).
template <typename Call>
double CallsPerSecond(const Cluster& cluster, int clients, int calls, const Call& call) {
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  const auto start = Clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto stub = cluster.Stub();
      for (int i = c; i < calls; i += clients) {
        const grpc::Status status = call(*stub, i);
        if (!status.ok() && failed.fetch_add(1) == 0) {
          std::fprintf(stderr, "control_plane_bench: a call failed: %s\n", status.error_message().c_str());
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return failed == 0 ? calls / Seconds(start) : 0;
}

// `calls_store` and `jobs_store`: two empty stores (the call phase leaves hundreds of queued jobs).
Row Measure(const std::string& dir, const std::string& calls_store, const std::string& jobs_store, int connections) {
  Row row;
  const std::string fixtures = absl::GetFlag(FLAGS_fixtures);
  const int calls = absl::GetFlag(FLAGS_calls), jobs = absl::GetFlag(FLAGS_jobs);
  {
    // The API alone: a worker inspects the upload and is stopped, so no worker takes the jobs
    // and every call is the API and the store.
    Cluster api_only(dir + "/calls", calls_store, connections, 1, absl::GetFlag(FLAGS_lease_seconds));
    if (!api_only.ok()) return row;
    auto stub = api_only.Stub();
    recal::v1::Model model;
    const grpc::Status uploaded =
        recal::testing::Upload(*stub, recal::testing::ReadBytes(fixtures + "/models/bn1d_2d.traced_train.pt"), &model);
    if (!uploaded.ok()) {
      std::fprintf(stderr, "control_plane_bench: upload failed: %s\n", uploaded.error_message().c_str());
      return row;
    }
    api_only.workers()[0]->Kill();
    std::vector<std::string> ids;
    auto start = Clock::now();
    for (int i = 0; i < calls; ++i) {
      grpc::ClientContext context;
      recal::v1::Job job;
      if (stub->SubmitJob(&context, recal::testing::NpyJob(model.id(), "data/bn1d_2d.npy", 8), &job).ok()) {
        ids.push_back(job.id());
      }
    }
    row.submits_per_s = ids.size() / Seconds(start);
    start = Clock::now();
    for (int i = 0; i < calls; ++i) {
      grpc::ClientContext context;
      recal::v1::GetJobRequest request;
      request.set_id(ids[i % ids.size()]);
      recal::v1::Job job;
      stub->GetJob(&context, request, &job).IgnoreError();
    }
    row.gets_per_s = calls / Seconds(start);
    const int clients = absl::GetFlag(FLAGS_clients);
    row.concurrent_submits_per_s = CallsPerSecond(api_only, clients, calls, [&](recal::v1::Recal::Stub& s, int) {
      grpc::ClientContext context;
      recal::v1::Job job;
      return s.SubmitJob(&context, recal::testing::NpyJob(model.id(), "data/bn1d_2d.npy", 8), &job);
    });
    row.concurrent_gets_per_s = CallsPerSecond(api_only, clients, calls, [&](recal::v1::Recal::Stub& s, int i) {
      grpc::ClientContext context;
      recal::v1::GetJobRequest request;
      request.set_id(ids[i % ids.size()]);
      recal::v1::Job job;
      return s.GetJob(&context, request, &job);
    });
  }
  {
    Cluster cluster(dir + "/jobs", jobs_store, connections, 2, absl::GetFlag(FLAGS_lease_seconds));
    if (!cluster.ok()) return row;
    auto stub = cluster.Stub();
    recal::v1::Model model;
    recal::testing::Upload(*stub, recal::testing::ReadBytes(fixtures + "/models/bn1d_2d.traced_train.pt"), &model)
        .IgnoreError();
    std::vector<std::string> ids;
    const auto start = Clock::now();
    for (int i = 0; i < jobs; ++i) {
      grpc::ClientContext context;
      recal::v1::Job job;
      if (stub->SubmitJob(&context, recal::testing::NpyJob(model.id(), "data/bn1d_2d.npy", 8), &job).ok()) {
        ids.push_back(job.id());
      }
    }
    int succeeded = 0;
    for (const std::string& id : ids) {
      succeeded += recal::testing::WaitForState(*stub, id, recal::v1::SUCCEEDED, 300).state() == recal::v1::SUCCEEDED;
    }
    row.jobs_per_s = succeeded == jobs ? succeeded / Seconds(start) : 0;  // 0: some job failed (logged)

    // Failover: a job that runs a while; its worker dies; how long until it runs again.
    recal::v1::Model resnet;
    recal::testing::Upload(*stub, recal::testing::ReadBytes(fixtures + "/models/resnet18.traced_eval.pt"), &resnet)
        .IgnoreError();
    recal::v1::SubmitJobRequest long_job = recal::testing::LongJob(resnet.id());
    grpc::ClientContext context;
    recal::v1::Job job;
    if (!stub->SubmitJob(&context, long_job, &job).ok()) return row;
    recal::testing::WaitForState(*stub, job.id(), recal::v1::RUNNING, 60);
    const std::regex started("job started job_id=" + job.id());
    for (int i = 0; i < 200; ++i) {
      for (auto& worker : cluster.workers()) {
        if (worker->ok() && std::regex_search(worker->log(), started)) {
          const auto killed = Clock::now();
          worker->Kill();
          recal::testing::PollJob(
              *stub, job.id(), [](const recal::v1::Job& j) { return j.attempts() == 2 && j.state() == recal::v1::RUNNING; },
              120);
          row.failover_s = Seconds(killed);
          grpc::ClientContext cancel_context;
          recal::v1::CancelJobRequest cancel;
          cancel.set_id(job.id());
          stub->CancelJob(&cancel_context, cancel, &job).IgnoreError();
          return row;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  recal::ParseCommandLineOrExit(argc, argv, "control_plane_bench", "control_plane_bench: the control plane on SQLite vs PostgreSQL: API calls/s, tiny jobs/s, failover time");
  auto postgres = recal::testing::PostgresServer::Shared();
  if (!postgres.ok()) {
    std::fprintf(stderr, "no PostgreSQL: %s\n", std::string(postgres.status().message()).c_str());
    return 1;
  }
  recal::testing::TempDir tmp;
  const int pool = recal::store::kDefaultStoreConnections;
  const Row sqlite = Measure(tmp.File("sqlite"), "sqlite:" + tmp.File("calls.db"), "sqlite:" + tmp.File("jobs.db"), pool);
  Row pg[2];
  for (int k = 0; k < 2; ++k) {
    auto calls = (*postgres)->NewDatabase();
    auto jobs = (*postgres)->NewDatabase();
    if (!calls.ok() || !jobs.ok()) return 1;
    pg[k] = Measure(tmp.File(absl::StrCat("postgres", k)), *calls, *jobs, k == 0 ? 1 : pool);
  }
  std::printf("control plane: 1 api process (+2 worker processes, 1 CPU worker each, for jobs), lease %d s; "
              "%d calls (from 1 client, then from %d at once), %d tiny jobs (bn1d_2d, 4 batches)\n",
              absl::GetFlag(FLAGS_lease_seconds), absl::GetFlag(FLAGS_calls), absl::GetFlag(FLAGS_clients),
              absl::GetFlag(FLAGS_jobs));
  const std::string pooled = absl::StrCat("PG, ", pool, " conns");
  std::printf("%-40s %10s %10s %12s %10s %10s\n", "", "SQLite", "PG, 1 conn", pooled.c_str(), "PG/SQLite",
              "pool/1");
  auto line = [&](const char* what, double Row::*field) {
    const double a = sqlite.*field, one = pg[0].*field, many = pg[1].*field;
    std::printf("%-40s %10.1f %10.1f %12.1f %10.2f %10.2f\n", what, a, one, many, a > 0 ? many / a : 0,
                one > 0 ? many / one : 0);
  };
  line("SubmitJob calls/s, 1 client (no workers)", &Row::submits_per_s);
  line("GetJob calls/s, 1 client", &Row::gets_per_s);
  line("SubmitJob calls/s, clients at once", &Row::concurrent_submits_per_s);
  line("GetJob calls/s, clients at once", &Row::concurrent_gets_per_s);
  line("tiny jobs/s end to end (2 workers)", &Row::jobs_per_s);
  line("failover s (kill -9 to RUNNING again)", &Row::failover_s);
  return 0;
}
