#include "server/jobs/scheduler.h"

#include <algorithm>
#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/now.h"
#include "common/status_macros.h"
#include "server/jobs/run_progress.h"
#include "server/jobs/store_retry.h"
#include "server/log/log.h"
#include "server/metrics/metrics.h"

namespace recal::jobs {
namespace {

SchedulerOptions WithOwner(SchedulerOptions options) {
  options.owner = LeaseOwner(std::move(options.owner));
  return options;
}

}  // namespace

Scheduler::Scheduler(JobRepository* jobs, store::BlobStore* blobs, ModelRegistry* models, JobRunner* runner,
                     StreamFeeds* feeds, SchedulerOptions options)
    : jobs_(jobs),
      blobs_(blobs),
      runner_(runner),
      feeds_(feeds),
      options_(WithOwner(std::move(options))),
      sources_{jobs, models, blobs, &options_.data_roots},
      leases_(jobs, options_, &wake_, stopping_),
      coordinator_(sources_, runner, feeds, &wake_, options_, [this](const std::string& id) { Cancel(id); }) {}

Scheduler::~Scheduler() { Shutdown(absl::Seconds(30)); }

absl::Status Scheduler::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return absl::OkStatus();
  if (!options_.devices.empty()) RECAL_RETURN_IF_ERROR(leases_.RecoverAtStart());
  RECAL_ASSIGN_OR_RETURN(const std::vector<v1::Job> waiting, jobs_->InStates({v1::QUEUED}));
  for (const v1::Job& job : waiting) {
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
  if (!options_.devices.empty()) leases_.StartReaper();
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
  leases_.StopReaper();
}

absl::Status Scheduler::CheckCapacity() const {
  if (stopping_) return absl::UnavailableError("the server is shutting down");
  RECAL_ASSIGN_OR_RETURN(const int64_t queued, jobs_->CountInStates({v1::QUEUED}));
  if (queued >= options_.max_queued_jobs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the queue is full: ", queued, " jobs are waiting (--max_queued_jobs); retry later"));
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

void Scheduler::Wake() { wake_.Wake(); }

void Scheduler::Cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto running = running_.find(id);
  if (running == running_.end()) return;
  running->second->by_user = true;
  running->second->cancel = true;
}

void Scheduler::CancelShards(const std::vector<v1::Job>& shards, const std::string& reason) {
  coordinator_.CancelShards(shards, reason);
}

int Scheduler::queued() const {
  auto queued = jobs_->CountInStates({v1::QUEUED});
  return queued.ok() ? static_cast<int>(*queued) : -1;
}

int Scheduler::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(running_.size());
}

void Scheduler::WorkerLoop(const std::string& device, store::ClaimKind kind) {
  {
    std::lock_guard<std::mutex> lock(workers_mu_);
    ++active_workers_;
  }
  while (!stopping_) {
    // Registered before the claim, so that a cancel right after it is not lost.
    auto running = std::make_shared<RunFlags>();
    // Read before the claim: an Enqueue between the claim and the wait is not missed.
    const int64_t seen = wake_.Count();
    auto claimed = leases_.Claim(device, kind);
    if (!claimed.ok()) {
      log::Error("no job claimed: the store refused", {{"device", device},
                                                        {"error", std::string(claimed.status().message())}});
      wake_.WaitAfter(seen, options_.poll_interval, stopping_);
      continue;
    }
    if (!claimed->has_value()) {
      wake_.WaitAfter(seen, options_.poll_interval, stopping_);
      continue;
    }
    const v1::Job& job = **claimed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_[job.id()] = running;
      if (stopping_) running->cancel = true;
    }
    RunJob(job, device, *running);
    std::lock_guard<std::mutex> lock(mu_);
    running_.erase(job.id());
  }
  {
    std::lock_guard<std::mutex> lock(workers_mu_);
    --active_workers_;
  }
  workers_cv_.notify_all();
}

void Scheduler::RunJob(const v1::Job& job, const std::string& device, RunFlags& flags) {
  const std::string& id = job.id();
  // Until the job's end is stored (SucceedWhileLeased waits for a store that is away).
  LeaseHeartbeat heartbeat(leases_, id, flags);
  const double queue_wait = SecondsBetween(job.create_time(), job.start_time());
  if (options_.metrics) {
    options_.metrics->job_queue_wait_seconds.Observe(queue_wait);
    options_.metrics->WorkerBusy(device).Increment();
  }
  log::Info("job started",
            {{"job_id", id}, {"device", device}, {"attempt", job.attempts()}, {"queue_wait_seconds", queue_wait}});
  absl::StatusOr<JobOutputs> outputs;
  {
    absl::Cleanup idle = [&] {
      if (options_.metrics) options_.metrics->WorkerBusy(device).Decrement();
    };
    outputs = store::IsCoordinated(job) ? coordinator_.Coordinate(job, flags) : Execute(job, device, flags);
  }
  feeds_->Close(id, absl::FailedPreconditionError("the job has ended"));
  if (flags.lease_lost) {
    log::Warning("job run abandoned: its lease went to another worker", {{"job_id", id}});
    return;
  }
  absl::StatusOr<v1::Job> ended = StoreEnd(job, outputs, flags, heartbeat);
  if (!ended.ok()) {
    // The store keeps the job RUNNING: its lease runs out and it is taken up again (--max_attempts).
    log::Error("job end not stored", {{"job_id", id}, {"error", std::string(ended.status().message())}});
    return;
  }
  if (ended->state() == v1::QUEUED) {
    log::Info("job re-queued: the server is shutting down", {{"job_id", id}});
    return;
  }
  JobFinished(*ended, options_.metrics);
  // A shard's end: its coordinator, if it is in this process, looks now (others hear of it
  // through the store's change notifications, or their next poll).
  if (!job.parent_id().empty()) Wake();
}

absl::StatusOr<v1::Job> Scheduler::StoreEnd(const v1::Job& job, const absl::StatusOr<JobOutputs>& outputs,
                                            const RunFlags& flags, LeaseHeartbeat& heartbeat) {
  if (outputs.ok()) return SucceedWhileLeased(job.id(), *outputs, flags, heartbeat);
  return heartbeat.Ending([&] { return StoreEndWithout(job, outputs.status(), flags); });
}

absl::StatusOr<v1::Job> Scheduler::StoreEndWithout(const v1::Job& job, const absl::Status& why,
                                                   const RunFlags& flags) {
  const std::string& id = job.id();
  const std::string& owner = options_.owner;
  if (flags.cancel && !flags.by_user) {
    if (options_.pushes == SchedulerOptions::Pushes::kRelayed && job.spec().data().has_client_stream()) {
      // Shutdown of a worker process: the batches relayed to it are gone with it, so the job
      // cannot run again (as when its lease expires, JobRepository::RecoverExpired).
      return jobs_->Fail(id,
                         absl::AbortedError("the worker process running this client-stream job shut down; the "
                                            "batches pushed to it are not kept, so it cannot run again: submit "
                                            "the job again and push from the first batch"),
                         owner);
    }
    // Shutdown: the job runs again, from the start, on the next worker that claims it.
    return jobs_->Requeue(id, owner);
  }
  if (flags.by_user) return jobs_->Cancelled(id, "cancelled by request", owner);
  return jobs_->Fail(id, why, owner);
}

absl::StatusOr<v1::Job> Scheduler::SucceedWhileLeased(const std::string& id, const JobOutputs& outputs,
                                                      const RunFlags& flags, LeaseHeartbeat& heartbeat) {
  // The store is away (restarting, say): the results are whole and the lease is still this
  // worker's (its heartbeat renews it once the store answers), so keep trying rather than leave
  // the job to run again once the lease runs out. Given up once the heartbeat lost the lease.
  bool warned = false;
  auto still_leased = [&](const absl::Status& unavailable) {
    const bool leased = !flags.lease_lost && !stopping_;
    if (leased && !warned) {
      log::Warning("job end not stored yet: trying again while the lease holds",
                   {{"job_id", id}, {"error", std::string(unavailable.message())}});
      warned = true;
    }
    return leased;
  };
  return RetryWhileUnavailable(
      [&] {
        return heartbeat.Ending([&] { return jobs_->Succeed(id, outputs.results, outputs.report, options_.owner); });
      },
      still_leased);
}

absl::StatusOr<JobOutputs> Scheduler::Execute(const v1::Job& job, const std::string& device, RunFlags& flags) {
  RECAL_ASSIGN_OR_RETURN(const std::unique_ptr<Scratch> scratch, Scratch::Make(*blobs_, job));
  RECAL_ASSIGN_OR_RETURN(const RecalibrationTask task,
                         BuildTask(sources_, job, TaskPurpose::Run(device), scratch->path(), flags.cancel));
  const double timeout = options_.TimeoutFor(job.spec());
  RunHooks hooks;
  hooks.cancel = &flags.cancel;
  hooks.deadline = absl::Now() + absl::Seconds(timeout);
  if (job.spec().data().has_client_stream()) RECAL_RETURN_IF_ERROR(AttachStream(job, flags, timeout, hooks));
  RunProgress progress(jobs_, job, options_);
  hooks.on_progress = [&progress](const worker::v1::Progress& event) { progress.OnEvent(event); };

  absl::StatusOr<v1::RunReport> report = runner_->Recalibrate(task, hooks);
  // Past the job's own deadline, whichever part noticed; before it, a pushed stream that went
  // idle (--stream_idle_seconds), which says so itself.
  if (absl::IsDeadlineExceeded(report.status()) && absl::Now() >= hooks.deadline) {
    return absl::DeadlineExceededError(absl::StrCat("the job ran past its timeout of ", timeout, " s"));
  }
  JobOutputs outputs;
  RECAL_ASSIGN_OR_RETURN(outputs.report, std::move(report));
  progress.Finish();
  const ScratchFiles files = job.parent_id().empty() ? JobFiles(job.spec()) : ShardFiles();
  RECAL_RETURN_IF_ERROR(sources_.models->stored_bytes().ReserveResultsWhileHeld(job, scratch->path(), files, flags));
  RECAL_ASSIGN_OR_RETURN(outputs.results, AdoptResults(*blobs_, scratch->path(), files));
  return outputs;
}

absl::Status Scheduler::AttachStream(const v1::Job& job, RunFlags& flags, double timeout, RunHooks& hooks) {
  std::shared_ptr<StreamFeed> feed;
  if (options_.pushes == SchedulerOptions::Pushes::kThisProcess) {
    feed = feeds_->Find(job.id());
  } else {
    RECAL_ASSIGN_OR_RETURN(feed, OpenRelayedFeed(job, flags));
  }
  if (!feed) return absl::CancelledError("the job's stream was closed before it started");
  feed->set_deadline(std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                            std::chrono::duration<double>(timeout)),
                     absl::ToChronoNanoseconds(options_.stream_idle), "--stream_idle_seconds");
  hooks.next_pushed = [feed] { return feed->Next(); };
  hooks.release_pushed = [feed] { feed->Close(absl::FailedPreconditionError("the job has ended")); };
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<StreamFeed>> Scheduler::OpenRelayedFeed(const v1::Job& job, RunFlags& flags) {
  if (options_.relay_endpoint.empty()) {
    return absl::FailedPreconditionError(
        "this client-stream job was taken by a worker process that serves no internal endpoint, so pushed "
        "batches cannot reach it: start workers with --internal_token_file (docs/cluster.md, 'Client streams across processes')");
  }
  // Recorded (again) before the feed opens: an api replica relays here once it reads it.
  auto record = [&] { return jobs_->RecordWorkerEndpoint(options_.owner, options_.relay_endpoint); };
  RECAL_RETURN_IF_ERROR(RetryWhileUnavailable(record, [&](const absl::Status&) { return !flags.cancel; }));
  return feeds_->Open(job);
}

}  // namespace recal::jobs
