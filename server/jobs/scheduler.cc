#include "server/jobs/scheduler.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <thread>

#include <google/protobuf/util/time_util.h>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/atomic_file.h"
#include "common/now.h"
#include "server/jobs/data_source_spec.h"
#include "server/log/log.h"
#include "server/metrics/metrics.h"

namespace recal::jobs {
namespace {

using google::protobuf::util::TimeUtil;

double SecondsBetween(const google::protobuf::Timestamp& from, const google::protobuf::Timestamp& to) {
  return TimeUtil::DurationToNanoseconds(to - from) / 1e9;
}

// What a run leaves in its scratch directory, by artifact.
const std::vector<std::pair<v1::Artifact, std::string>> kJobFiles = {
    {v1::MODEL, "model.pt"}, {v1::BN_BUFFERS, "bn.safetensors"}, {v1::REPORT, "report.json"}};
const std::vector<std::pair<v1::Artifact, std::string>> kShardFiles = {{v1::SHARD_STATISTICS, kShardStatisticsFile}};

// A job's scratch directory, emptied of what an earlier attempt left; removed when it goes.
class Scratch {
 public:
  static absl::StatusOr<std::unique_ptr<Scratch>> Make(std::filesystem::path path) {
    std::error_code error;
    std::filesystem::remove_all(path, error);
    std::filesystem::create_directories(path, error);
    if (error) return absl::InternalError(absl::StrCat("cannot create ", path.string(), ": ", error.message()));
    return std::unique_ptr<Scratch>(new Scratch(std::move(path)));
  }
  ~Scratch() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  explicit Scratch(std::filesystem::path path) : path_(std::move(path)) {}
  const std::filesystem::path path_;
};

SchedulerOptions WithOwner(SchedulerOptions options) {
  if (options.owner.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    absl::BitGen random;
    options.owner = absl::StrFormat("%s:%d:%08x", host, ::getpid(), absl::Uniform<uint32_t>(random));
  }
  return options;
}

}  // namespace

Scheduler::Scheduler(JobRepository* jobs, store::BlobStore* blobs, ModelRegistry* models, JobRunner* runner,
                     StreamFeeds* feeds, SchedulerOptions options)
    : jobs_(jobs), blobs_(blobs), models_(models), runner_(runner), feeds_(feeds), options_(WithOwner(std::move(options))) {}

Scheduler::~Scheduler() { Shutdown(absl::Seconds(30)); }

absl::Status Scheduler::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return absl::OkStatus();
  if (!options_.devices.empty()) {
    auto recovered = options_.recover_all_at_start
                         ? jobs_->RecoverInterrupted(options_.max_attempts)
                         : jobs_->RecoverExpired(absl::ToUnixMillis(absl::Now()), options_.max_attempts);
    if (!recovered.ok()) return recovered.status();
    for (const v1::Job& job : *recovered) {
      if (IsTerminal(job.state())) {
        JobFinished(job, options_.metrics);
      } else {
        log::Info("job re-queued at start-up", {{"job_id", job.id()}, {"attempts", job.attempts()}});
      }
    }
  }
  auto waiting = jobs_->InStates({v1::QUEUED});
  if (!waiting.ok()) return waiting.status();
  for (const v1::Job& job : *waiting) {
    if (options_.pushes == SchedulerOptions::Pushes::kThisProcess && job.spec().data().has_client_stream() &&
        !store::IsCoordinated(job)) {
      feeds_->Open(job);
    }
  }
  for (const std::string& device : options_.devices) {
    workers_.emplace_back([this, device] { WorkerLoop(device, store::ClaimKind::kRun); });
  }
  const size_t coordinators = options_.devices.empty() ? 0 : std::max<size_t>(2, options_.devices.size());
  for (size_t i = 0; i < coordinators; ++i) {
    workers_.emplace_back([this] { WorkerLoop("coordinator", store::ClaimKind::kCoordinate); });
  }
  if (!options_.devices.empty()) reaper_ = std::thread([this] { ReaperLoop(); });
  started_ = true;
  return absl::OkStatus();
}

void Scheduler::Shutdown(absl::Duration deadline) {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, running] : running_) running->cancel = true;
  }
  Wake();
  bool all_stopped;
  {
    std::unique_lock<std::mutex> lock(workers_mu_);
    all_stopped = workers_cv_.wait_for(lock, absl::ToChronoSeconds(deadline), [&] { return active_workers_ == 0; });
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (std::thread& worker : workers_) {
    // A worker still ending its job past the deadline is left to the process exit.
    if (all_stopped) {
      worker.join();
    } else {
      worker.detach();
    }
  }
  workers_.clear();
  if (reaper_.joinable()) reaper_.join();
}

absl::Status Scheduler::CheckCapacity() const {
  if (stopping_) return absl::UnavailableError("the server is shutting down");
  auto queued = jobs_->CountInStates({v1::QUEUED});
  if (!queued.ok()) return queued.status();
  if (*queued >= options_.max_queued_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat("the queue is full: ", *queued,
                                                     " jobs are waiting (--max_queued_jobs); retry later"));
  }
  return absl::OkStatus();
}

void Scheduler::Enqueue(const v1::Job& job) {
  // Relayed pushes go to the feed the claiming worker process opens, wherever it runs.
  if (options_.pushes == SchedulerOptions::Pushes::kThisProcess && job.spec().data().has_client_stream()) {
    if (!store::IsCoordinated(job)) {
      feeds_->Open(job);
    } else {
      for (int k = 0; k < job.spec().shards(); ++k) {  // one pusher per shard
        v1::Job shard = job;
        shard.set_id(ShardJobId(job.id(), k));
        feeds_->Open(shard);
      }
    }
  }
  Wake();
}

void Scheduler::Wake() {
  // All: lease keepers and the reaper wait on the same variable.
  {
    std::lock_guard<std::mutex> lock(wake_mu_);
    ++wakes_;
  }
  wake_.notify_all();
}

void Scheduler::Cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto running = running_.find(id);
  if (running == running_.end()) return;
  running->second->by_user = true;
  running->second->cancel = true;
}

int Scheduler::queued() const {
  auto queued = jobs_->CountInStates({v1::QUEUED});
  return queued.ok() ? static_cast<int>(*queued) : -1;
}

int Scheduler::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(running_.size());
}

int64_t Scheduler::Wakes() {
  std::lock_guard<std::mutex> lock(wake_mu_);
  return wakes_;
}

void Scheduler::WaitForWork(int64_t seen, absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(wake_mu_);
  wake_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] { return wakes_ != seen || stopping_; });
}

void Scheduler::WorkerLoop(const std::string& device, store::ClaimKind kind) {
  {
    std::lock_guard<std::mutex> lock(workers_mu_);
    ++active_workers_;
  }
  while (!stopping_) {
    // Registered before the claim, so that a cancel right after it is not lost.
    auto running = std::make_shared<Running>();
    // Read before the claim: an Enqueue between the claim and the wait is not missed.
    const int64_t seen = Wakes();
    auto claimed = jobs_->Claim(device, options_.owner, absl::ToUnixMillis(absl::Now() + options_.lease), kind,
                                options_.max_running_jobs);
    if (!claimed.ok()) {
      log::Error("no job claimed: the store refused", {{"device", device},
                                                        {"error", std::string(claimed.status().message())}});
      WaitForWork(seen, options_.poll_interval);
      continue;
    }
    if (!claimed->has_value()) {
      WaitForWork(seen, options_.poll_interval);
      continue;
    }
    const v1::Job& job = **claimed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_[job.id()] = running;
      if (stopping_) running->cancel = true;
    }
    RunJob(job, device, running);
    std::lock_guard<std::mutex> lock(mu_);
    running_.erase(job.id());
  }
  {
    std::lock_guard<std::mutex> lock(workers_mu_);
    --active_workers_;
  }
  workers_cv_.notify_all();
}

void Scheduler::ReaperLoop() {
  while (!stopping_) {
    WaitForWork(Wakes(), options_.poll_interval);
    if (stopping_) break;
    auto recovered = jobs_->RecoverExpired(absl::ToUnixMillis(absl::Now()), options_.max_attempts);
    if (!recovered.ok()) {
      log::Warning("expired leases not recovered", {{"error", std::string(recovered.status().message())}});
      continue;
    }
    for (const v1::Job& job : *recovered) {
      if (IsTerminal(job.state())) {
        JobFinished(job, options_.metrics);
      } else {
        log::Info("job re-queued: its worker stopped renewing its lease",
                  {{"job_id", job.id()}, {"attempts", job.attempts()}});
        if (options_.metrics) options_.metrics->leases_expired.Increment();
        Wake();
      }
    }
  }
}

void Scheduler::KeepLease(const std::string& id, Running& running, const std::atomic<bool>& done) {
  const absl::Duration every = std::min(options_.lease / 3, absl::Seconds(1));
  absl::Time last_renewed = absl::Now();
  while (!done) {
    {
      std::unique_lock<std::mutex> lock(wake_mu_);
      // Not on stopping_: the run ends on its own (cancelled) and the lease is kept till then.
      wake_.wait_for(lock, absl::ToChronoMilliseconds(every), [&] { return done.load(); });
    }
    if (done) return;
    auto state = jobs_->Renew(id, options_.owner, absl::ToUnixMillis(absl::Now() + options_.lease));
    if (state.ok()) {
      last_renewed = absl::Now();
      if (*state == v1::CANCELLING && !running.cancel) {
        running.by_user = true;
        running.cancel = true;
      }
      continue;
    }
    // Lost (expired and taken back), or the store unreachable for a whole lease: another
    // worker may run the job now, so this one stops and writes nothing.
    if (absl::IsFailedPrecondition(state.status()) || absl::IsNotFound(state.status()) ||
        absl::Now() - last_renewed > options_.lease) {
      log::Warning("job lease lost: stopping its run", {{"job_id", id}, {"error", std::string(state.status().message())}});
      running.lease_lost = true;
      running.cancel = true;
      if (options_.metrics) options_.metrics->leases_lost.Increment();
      return;
    }
  }
}

void Scheduler::RunJob(const v1::Job& job, const std::string& device, const std::shared_ptr<Running>& running) {
  const std::string& id = job.id();
  std::atomic<bool> done{false};
  std::thread keeper([&] { KeepLease(id, *running, done); });
  absl::Cleanup stop_keeper = [&] {
    done = true;
    wake_.notify_all();
    keeper.join();
  };
  const double queue_wait = SecondsBetween(job.create_time(), job.start_time());
  if (options_.metrics) {
    options_.metrics->job_queue_wait_seconds.Observe(queue_wait);
    options_.metrics->WorkerBusy(device).Increment();
  }
  log::Info("job started",
            {{"job_id", id}, {"device", device}, {"attempt", job.attempts()}, {"queue_wait_seconds", queue_wait}});
  absl::StatusOr<Outputs> outputs;
  {
    absl::Cleanup idle = [&] {
      if (options_.metrics) options_.metrics->WorkerBusy(device).Decrement();
    };
    outputs = store::IsCoordinated(job) ? Coordinate(job, *running) : Execute(job, device, *running);
  }
  feeds_->Close(id, absl::FailedPreconditionError("the job has ended"));
  if (running->lease_lost) {
    log::Warning("job run abandoned: its lease went to another worker", {{"job_id", id}});
    return;
  }

  const std::string& owner = options_.owner;
  absl::StatusOr<v1::Job> ended;
  if (outputs.ok()) {
    ended = jobs_->Succeed(id, outputs->results, outputs->report, owner);
    // The store is away (restarting, say): the results are whole and the lease is still this
    // worker's (its keeper renews it once the store answers), so keep trying rather than leave
    // the job to run again once the lease runs out. Given up once the keeper lost the lease.
    if (absl::IsUnavailable(ended.status()) && !running->lease_lost && !stopping_) {
      log::Warning("job end not stored yet: trying again while the lease holds",
                   {{"job_id", id}, {"error", std::string(ended.status().message())}});
    }
    while (absl::IsUnavailable(ended.status()) && !running->lease_lost && !stopping_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      ended = jobs_->Succeed(id, outputs->results, outputs->report, owner);
    }
  } else if (running->cancel && !running->by_user && options_.pushes == SchedulerOptions::Pushes::kRelayed &&
             job.spec().data().has_client_stream()) {
    // Shutdown of a worker process: the batches relayed to it are gone with it, so the job
    // cannot run again (as when its lease expires, JobRepository::RecoverExpired).
    ended = jobs_->Fail(id,
                        absl::AbortedError("the worker process running this client-stream job shut down; the "
                                           "batches pushed to it are not kept, so it cannot run again: submit the "
                                           "job again and push from the first batch"),
                        owner);
  } else if (running->cancel && !running->by_user) {
    // Shutdown: the job runs again, from the start, on the next worker that claims it.
    ended = jobs_->Requeue(id, owner);
    if (ended.ok() && ended->state() == v1::QUEUED) {
      log::Info("job re-queued: the server is shutting down", {{"job_id", id}});
      return;
    }
  } else if (running->by_user) {
    ended = jobs_->Cancelled(id, "cancelled by request", owner);
  } else {
    ended = jobs_->Fail(id, outputs.status(), owner);
  }
  if (!ended.ok()) {
    // The store keeps the job RUNNING: its lease runs out and it is taken up again (--max_attempts).
    log::Error("job end not stored", {{"job_id", id}, {"error", std::string(ended.status().message())}});
    return;
  }
  JobFinished(*ended, options_.metrics);
  // A shard's end: its coordinator, if it is in this process, looks now (others hear of it
  // through the store's change notifications, or their next poll).
  if (!job.parent_id().empty()) Wake();
}

void JobFinished(const v1::Job& job, metrics::Metrics* metrics) {
  const bool started = job.has_start_time();
  const double duration = started ? SecondsBetween(job.start_time(), job.end_time()) : 0;
  if (metrics) {
    metrics->JobsFinished(v1::JobState_Name(job.state()), job.tenant()).Increment();
    if (started) metrics->job_duration_seconds.Observe(duration);
  }
  log::Fields fields = {{"job_id", job.id()}, {"state", v1::JobState_Name(job.state())}};
  if (started) fields.emplace_back("duration_seconds", duration);
  if (job.has_progress()) {
    fields.emplace_back("batches", job.progress().batches_done());
    fields.emplace_back("samples", job.progress().samples_done());
  }
  if (job.has_error()) fields.emplace_back("error", job.error().message());
  log::Write(job.state() == v1::FAILED ? log::Level::kWarning : log::Level::kInfo, "job finished", fields);
}

absl::StatusOr<Scheduler::Outputs> Scheduler::Execute(const v1::Job& job, const std::string& device,
                                                      Running& running) {
  const v1::JobSpec& spec = job.spec();
  auto model = models_->DigestOf(job.tenant(), spec.model_id());
  // The store is away: the job is not at fault, so wait (the lease keeper holds the job) rather
  // than fail it with the store's error; a lease lost meanwhile sets `cancel`.
  while (absl::IsUnavailable(model.status()) && !running.cancel) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    model = models_->DigestOf(job.tenant(), spec.model_id());
  }
  if (!model.ok()) return model.status();
  // Blobs in a bucket: the model is fetched here, and an endpoint still away after the client's
  // bounded retries fails the job (UNAVAILABLE) instead of holding the worker.
  auto model_path = blobs_->LocalPath(*model);
  if (!model_path.ok()) return model_path.status();
  const std::vector<std::string> data_roots = options_.data_roots.For(job.tenant());
  auto data_spec = DataSpecFor(spec.data(), data_roots);
  if (!data_spec.ok()) return data_spec.status();
  const double timeout = spec.timeout_seconds() > 0 ? spec.timeout_seconds() : options_.default_timeout_seconds;

  RunHooks hooks;
  hooks.cancel = &running.cancel;
  hooks.deadline = absl::Now() + absl::Seconds(timeout);
  if (spec.data().has_client_stream()) {
    std::shared_ptr<StreamFeed> feed;
    if (options_.pushes == SchedulerOptions::Pushes::kThisProcess) {
      feed = feeds_->Find(job.id());
    } else {
      auto opened = OpenRelayedFeed(job, running);
      if (!opened.ok()) return opened.status();
      feed = *std::move(opened);
    }
    if (!feed) return absl::CancelledError("the job's stream was closed before it started");
    feed->set_deadline(std::chrono::steady_clock::now() +
                           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(timeout)),
                       absl::ToChronoNanoseconds(options_.stream_idle), "--stream_idle_seconds");
    hooks.next_pushed = [feed] { return feed->Next(); };
    hooks.release_pushed = [feed] { feed->Close(absl::FailedPreconditionError("the job has ended")); };
  }

  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  auto last_event = std::chrono::steady_clock::now() - std::chrono::hours(1);
  int64_t counted_batches = 0, counted_samples = 0;
  auto publish = [&](const worker::v1::Progress& p, int64_t total) {
    v1::JobProgress progress;
    progress.set_batches_done(p.batches());
    progress.set_batches_total(total);
    progress.set_samples_done(p.samples());
    progress.set_samples_per_second(elapsed() > 0 ? p.samples() / elapsed() : 0);
    progress.set_eta_seconds(p.batches() > 0 ? elapsed() / p.batches() * (total - p.batches()) : 0);
    progress.set_rel_std_error(std::isfinite(p.rel_std_error()) ? p.rel_std_error() : -1);
    // Progress is advice: a store that refuses it does not stop the job.
    jobs_->Progress(job.id(), progress).IgnoreError();
  };
  std::optional<worker::v1::Progress> latest;
  bool latest_published_as_final = false;
  hooks.on_progress = [&](const worker::v1::Progress& p) {
    if (options_.metrics) {
      options_.metrics->batches_processed.Increment(static_cast<double>(p.batches() - counted_batches));
      options_.metrics->samples_processed.Increment(static_cast<double>(p.samples() - counted_samples));
    }
    counted_batches = p.batches();
    counted_samples = p.samples();
    const auto now = std::chrono::steady_clock::now();
    const int64_t total =
        p.total_samples() > 0
            ? std::min(p.max_batches(), (p.total_samples() + spec.batch_size() - 1) / spec.batch_size())
            : p.max_batches();
    const bool last = p.batches() >= total;
    latest = p;
    latest_published_as_final = last;
    if (!last && now - last_event < absl::ToChronoMilliseconds(options_.progress_interval)) return;
    last_event = now;
    publish(p, total);
  };

  auto made = Scratch::Make(std::filesystem::path(blobs_->scratch_dir()) / job.id());
  if (!made.ok()) return made.status();
  const std::filesystem::path& scratch = (*made)->path();

  RecalibrationTask task;
  task.spec = spec;
  task.model_path = *model_path;
  task.data_spec = spec.data().has_client_stream() ? "" : *data_spec;
  task.data_roots = data_roots;
  task.device = device;
  task.scratch_dir = scratch.string();
  const bool shard = !job.parent_id().empty();
  if (shard) {
    task.shard_index = job.shard();
    task.shard_count = spec.shards();
  }
  absl::StatusOr<v1::RunReport> report = runner_->Recalibrate(task, hooks);
  // Past the job's own deadline, whichever part noticed; before it, a pushed stream that went
  // idle (--stream_idle_seconds), which says so itself.
  if (absl::IsDeadlineExceeded(report.status()) && absl::Now() >= hooks.deadline) {
    return absl::DeadlineExceededError(absl::StrCat("the job ran past its timeout of ", timeout, " s"));
  }
  if (!report.ok()) return report.status();
  // The data ended before the expected count (skipped files, a stream, early stopping) or
  // the last event was throttled away: the last event says where it really ended.
  if (latest && !latest_published_as_final) publish(*latest, latest->batches());

  Outputs outputs;
  outputs.report = *std::move(report);
  auto results = AdoptResults(scratch.string(), shard ? kShardFiles : kJobFiles);
  if (!results.ok()) return results.status();
  outputs.results = *std::move(results);
  return outputs;
}

absl::StatusOr<std::shared_ptr<StreamFeed>> Scheduler::OpenRelayedFeed(const v1::Job& job, Running& running) {
  if (options_.relay_endpoint.empty()) {
    return absl::FailedPreconditionError(
        "this client-stream job was taken by a worker process that serves no internal endpoint, so pushed "
        "batches cannot reach it: start workers with --internal_token_file (docs/cluster.md, 'Client streams across processes')");
  }
  // Recorded (again) before the feed opens: an api replica relays here once it reads it.
  absl::Status recorded = jobs_->RecordWorkerEndpoint(options_.owner, options_.relay_endpoint);
  while (absl::IsUnavailable(recorded) && !running.cancel) {  // the store is away: wait, as Execute does
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    recorded = jobs_->RecordWorkerEndpoint(options_.owner, options_.relay_endpoint);
  }
  if (!recorded.ok()) return recorded;
  return feeds_->Open(job);
}

absl::StatusOr<std::map<v1::Artifact, store::ResultRef>> Scheduler::AdoptResults(
    const std::string& scratch, const std::vector<std::pair<v1::Artifact, std::string>>& files) {
  std::map<v1::Artifact, store::ResultRef> results;
  for (const auto& [artifact, name] : files) {
    // Written by the worker: only plain files are taken (AdoptFile refuses links).
    auto digest = blobs_->AdoptFile((std::filesystem::path(scratch) / name).string());
    if (!digest.ok()) return digest.status();
    auto size = blobs_->SizeOf(*digest);
    if (!size.ok()) return size.status();
    results[artifact] = {*digest, *size};
  }
  return results;
}

void Scheduler::CancelShards(const std::vector<v1::Job>& shards, const std::string& reason) {
  for (const v1::Job& shard : shards) {
    if (IsTerminal(shard.state())) continue;
    auto cancelled = jobs_->Cancel(shard.id(), reason);
    if (!cancelled.ok()) {
      log::Warning("shard not cancelled", {{"job_id", shard.id()}, {"error", std::string(cancelled.status().message())}});
      continue;
    }
    Cancel(shard.id());  // if it runs in this process; elsewhere its worker sees CANCELLING
    feeds_->Close(shard.id(), absl::CancelledError(reason));
    if (IsTerminal(cancelled->state())) JobFinished(*cancelled, options_.metrics);
  }
}

namespace {

// A sharded job's progress: its shards' summed (rates too: they run side by side).
v1::JobProgress SumOfShards(const std::vector<v1::Job>& shards) {
  v1::JobProgress sum;
  bool total_known = true;
  double eta = 0, rel = -1;
  for (const v1::Job& shard : shards) {
    const v1::JobProgress& p = shard.progress();
    sum.set_batches_done(sum.batches_done() + p.batches_done());
    sum.set_batches_total(sum.batches_total() + p.batches_total());
    sum.set_samples_done(sum.samples_done() + p.samples_done());
    if (shard.state() == v1::RUNNING) sum.set_samples_per_second(sum.samples_per_second() + p.samples_per_second());
    total_known = total_known && p.batches_total() > 0;
    eta = std::max(eta, p.eta_seconds());
    rel = std::max(rel, p.rel_std_error());
  }
  if (!total_known) sum.set_batches_total(0);
  sum.set_eta_seconds(eta);
  sum.set_rel_std_error(rel);
  return sum;
}

// The devices that ran a sharded job's shards, each once, in shard order ("cuda:0,cuda:1").
std::string ShardDevices(const std::vector<v1::Job>& shards) {
  std::vector<std::string> devices;
  for (const v1::Job& shard : shards) {
    if (!shard.device().empty() && std::find(devices.begin(), devices.end(), shard.device()) == devices.end()) {
      devices.push_back(shard.device());
    }
  }
  return absl::StrJoin(devices, ",");
}

}  // namespace

absl::StatusOr<Scheduler::Outputs> Scheduler::Coordinate(const v1::Job& job, Running& running) {
  const v1::JobSpec& spec = job.spec();
  const double timeout = spec.timeout_seconds() > 0 ? spec.timeout_seconds() : options_.default_timeout_seconds;
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout);
  std::vector<v1::Job> shards;
  v1::JobProgress published;
  while (true) {
    const int64_t seen = Wakes();
    if (running.cancel) {
      // Cancelled: the shards stop too. Shutdown or a lost lease: they go on, and the
      // coordinator that takes the job up next finds them where they are.
      if (running.by_user) CancelShards(shards, "the sharded job was cancelled");
      return absl::CancelledError("cancelled");
    }
    if (absl::Now() > deadline) {
      CancelShards(shards, "the sharded job ran past its timeout");
      return absl::DeadlineExceededError(absl::StrCat("the job ran past its timeout of ", timeout, " s"));
    }
    auto read = jobs_->Children(job.id());
    if (read.ok()) {
      shards = *std::move(read);
      if (static_cast<int>(shards.size()) != spec.shards()) {
        return absl::InternalError(absl::StrCat("job ", job.id(), " has ", shards.size(), " shards stored, not ",
                                                spec.shards()));
      }
      const v1::JobProgress progress = SumOfShards(shards);
      if (progress.SerializeAsString() != published.SerializeAsString()) {
        jobs_->Progress(job.id(), progress).IgnoreError();  // advice, as for a job's own progress
        published = progress;
      }
      int succeeded = 0;
      for (const v1::Job& shard : shards) {
        if (shard.state() == v1::SUCCEEDED) ++succeeded;
        if (shard.state() == v1::FAILED || shard.state() == v1::CANCELLED) {
          CancelShards(shards, absl::StrCat("shard ", shard.shard(), " of the job ended ",
                                            v1::JobState_Name(shard.state())));
          const absl::StatusCode code = shard.state() == v1::CANCELLED
                                            ? absl::StatusCode::kCancelled
                                            : static_cast<absl::StatusCode>(shard.error().code());
          return absl::Status(code, absl::StrCat("shard ", shard.shard(), " (", shard.id(), ") ",
                                                 v1::JobState_Name(shard.state()), ": ", shard.error().message()));
        }
      }
      if (succeeded == spec.shards()) break;
    }
    // A store that does not answer is waited out: the lease keeper decides when to give up.
    WaitForWork(seen, std::min(options_.poll_interval, absl::Milliseconds(250)));
  }

  auto model = models_->DigestOf(job.tenant(), spec.model_id());
  if (!model.ok()) return model.status();
  auto model_path = blobs_->LocalPath(*model);
  if (!model_path.ok()) return model_path.status();
  auto made = Scratch::Make(std::filesystem::path(blobs_->scratch_dir()) / job.id());
  if (!made.ok()) return made.status();
  const std::filesystem::path& scratch = (*made)->path();
  RecalibrationTask task;
  task.spec = spec;
  task.model_path = *model_path;
  const std::vector<std::string> data_roots = options_.data_roots.For(job.tenant());
  auto data_spec = DataSpecFor(spec.data(), data_roots);
  task.data_spec = data_spec.ok() && !spec.data().has_client_stream() ? *data_spec : "";
  task.device = "cpu";  // the merge is arithmetic on a few kB per layer
  task.scratch_dir = scratch.string();
  for (const v1::Job& shard : shards) {
    auto ref = jobs_->Result(shard.id(), v1::SHARD_STATISTICS);
    if (!ref.ok()) return ref.status();
    auto reader = blobs_->OpenReader(ref->sha256);
    if (!reader.ok()) return reader.status();
    const std::string name = absl::StrCat("shard-", shard.shard(), ".safetensors");
    std::string bytes;  // a few kB per layer
    if (absl::Status read = (*reader)->ReadAt(0, (*reader)->size(), &bytes); !read.ok()) return read;
    if (absl::Status copied = WriteFileAtomically((scratch / name).string(), bytes); !copied.ok()) return copied;
    task.merge_statistics.push_back(name);
  }
  RunHooks hooks;
  hooks.cancel = &running.cancel;
  hooks.deadline = deadline;
  absl::StatusOr<v1::RunReport> report = runner_->Recalibrate(task, hooks);
  if (!report.ok()) return report.status();
  Outputs outputs;
  outputs.report = *std::move(report);
  outputs.report.set_seconds(SecondsBetween(job.start_time(), NowTimestamp()));
  // The merge ran on the CPU; the statistics come from where the shards ran.
  outputs.report.set_device(ShardDevices(shards));
  auto results = AdoptResults(scratch.string(), kJobFiles);
  if (!results.ok()) return results.status();
  outputs.results = *std::move(results);
  return outputs;
}

}  // namespace recal::jobs
