#include "server/jobs/job_manager.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

#include <google/protobuf/util/time_util.h>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/jobs/data_source_spec.h"
#include "server/log/log.h"
#include "server/metrics/metrics.h"

namespace recal::jobs {
namespace {

using google::protobuf::util::TimeUtil;

std::string NewJobId() {
  absl::BitGen gen;
  return absl::StrFormat("job-%016x", absl::Uniform<uint64_t>(gen));
}

v1::JobEvent StateEvent(v1::JobState state) {
  v1::JobEvent event;
  event.set_state(state);
  return event;
}

v1::JobError ErrorOf(const absl::Status& status) {
  v1::JobError error;
  error.set_code(static_cast<int>(status.code()));
  error.set_message(std::string(status.message()));
  return error;
}

double SecondsBetween(const google::protobuf::Timestamp& from, const google::protobuf::Timestamp& to) {
  return TimeUtil::DurationToNanoseconds(to - from) / 1e9;
}

const char* DataKind(const v1::JobSpec& spec) {
  if (spec.data().has_client_stream()) return "client_stream";
  if (spec.data().has_synthetic()) return "synthetic";
  if (spec.data().has_tensor_file()) return "tensor_file";
  return "other";
}

}  // namespace

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

struct JobManager::Outputs {
  std::map<v1::Artifact, store::ResultRef> results;
  v1::RunReport report;
};

JobManager::JobManager(store::MetadataStore* metadata, store::BlobStore* blobs,
                       ModelRegistry* models, JobRunner* runner, JobManagerOptions options)
    : metadata_(metadata),
      blobs_(blobs),
      models_(models),
      runner_(runner),
      options_(std::move(options)),
      queue_(options_.max_queued_jobs) {}

JobManager::~JobManager() { Shutdown(absl::Seconds(30)); }

absl::Status JobManager::Record(const v1::Job& job, v1::JobEvent event) {
  auto stored = metadata_->UpdateJob(job, std::move(event));
  if (!stored.ok()) return stored.status();
  events_.Publish();
  return absl::OkStatus();
}

absl::Status JobManager::RecordState(v1::Job& job, v1::JobState state) {
  job.set_state(state);
  if (IsTerminal(state)) *job.mutable_end_time() = TimeUtil::GetCurrentTime();
  return Record(job, StateEvent(state));
}

absl::Status JobManager::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return absl::OkStatus();
  // A previous process died with these jobs in flight: run them again from the start.
  auto interrupted = metadata_->JobsInStates({v1::RUNNING, v1::CANCELLING});
  if (!interrupted.ok()) return interrupted.status();
  for (v1::Job& job : *interrupted) {
    v1::JobState next = job.state() == v1::CANCELLING ? v1::CANCELLED : v1::QUEUED;
    if (next == v1::CANCELLED) *job.mutable_error() = ErrorOf(absl::CancelledError("cancelled"));
    // A job that keeps taking the server down must not do so forever.
    if (next == v1::QUEUED && job.attempts() >= options_.max_attempts) {
      next = v1::FAILED;
      *job.mutable_error() = ErrorOf(absl::AbortedError(absl::StrCat(
          "the server stopped while this job ran, ", job.attempts(), " times (--max_attempts=",
          options_.max_attempts, "); it is not run again")));
    }
    job.clear_progress();
    if (absl::Status s = RecordState(job, next); !s.ok()) return s;
    if (next != v1::QUEUED) {
      Finished(job);
    } else {
      log::Info("job re-queued at start-up", {{"job_id", job.id()}, {"attempts", job.attempts()}});
    }
  }
  auto waiting = metadata_->JobsInStates({v1::QUEUED});
  if (!waiting.ok()) return waiting.status();
  for (const v1::Job& job : *waiting) {
    queue_.Push(job.id(), job.spec().priority(), /*force=*/true).IgnoreError();
  }
  for (const std::string& device : options_.devices) {
    workers_.emplace_back([this, device] { WorkerLoop(device); });
  }
  started_ = true;
  return absl::OkStatus();
}

void JobManager::Shutdown(absl::Duration deadline) {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, running] : running_) running->cancel = true;
    for (auto& [id, feed] : feeds_) feed->Close(absl::UnavailableError("the server is shutting down"));
  }
  queue_.Close();
  events_.Publish();  // watchers see stopping_
  {
    std::unique_lock<std::mutex> lock(workers_mu_);
    workers_cv_.wait_for(lock, absl::ToChronoSeconds(deadline),
                         [&] { return active_workers_ == 0; });
  }
  for (std::thread& worker : workers_) {
    // A worker still inside a forward pass past the deadline is left to the process exit.
    if (active_workers_ == 0) {
      worker.join();
    } else {
      worker.detach();
    }
  }
  workers_.clear();
}

absl::Status JobManager::ValidateSpec(const v1::JobSpec& spec) {
  if (spec.model_id().empty()) return absl::InvalidArgumentError("spec.model_id is required");
  auto model = models_->Get(spec.model_id());
  if (!model.ok()) return model.status();
  if (spec.batch_size() < 1 || spec.batch_size() > options_.max_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat("spec.batch_size must be in 1..",
                                                   options_.max_batch_size, ", got ", spec.batch_size()));
  }
  if (spec.options().max_batches() < 0) return absl::InvalidArgumentError("options.max_batches < 0");
  if (spec.options().target_rel_error() < 0) {
    return absl::InvalidArgumentError("options.target_rel_error < 0");
  }
  if (spec.timeout_seconds() < 0) return absl::InvalidArgumentError("spec.timeout_seconds < 0");
  return DataSpecFor(spec.data(), options_.data_roots).status();
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::SubmitJobRequest& request) {
  if (stopping_) return absl::UnavailableError("the server is shutting down");
  if (absl::Status valid = ValidateSpec(request.spec()); !valid.ok()) return valid;
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.size() >= options_.max_queued_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat("the queue is full: ", options_.max_queued_jobs,
                                                     " jobs are waiting (--max_queued_jobs); retry later"));
  }
  v1::Job job;
  job.set_id(NewJobId());
  job.set_request_id(request.request_id());
  *job.mutable_spec() = request.spec();
  job.set_state(v1::QUEUED);
  *job.mutable_create_time() = TimeUtil::GetCurrentTime();
  bool created = false;
  auto stored = metadata_->CreateJob(job, &created);
  if (!stored.ok() || !created) return stored;
  if (absl::Status s = Record(*stored, StateEvent(v1::QUEUED)); !s.ok()) return s;
  if (options_.metrics) options_.metrics->jobs_submitted.Increment();
  log::Info("job submitted", {{"job_id", stored->id()},
                              {"model_id", stored->spec().model_id()},
                              {"data", DataKind(stored->spec())},
                              {"batch_size", stored->spec().batch_size()},
                              {"priority", stored->spec().priority()}});
  if (stored->spec().data().has_client_stream()) FeedLocked(*stored);
  queue_.Push(stored->id(), stored->spec().priority(), /*force=*/true).IgnoreError();
  return stored;
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& id) { return metadata_->GetJob(id); }

absl::StatusOr<store::JobPage> JobManager::List(const std::vector<v1::JobState>& states,
                                                int page_size, const std::string& page_token) {
  return metadata_->ListJobs(states, page_size, page_token);
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto job = metadata_->GetJob(id);
  if (!job.ok()) return job.status();
  if (IsTerminal(job->state()) || job->state() == v1::CANCELLING) return job;
  if (job->state() == v1::QUEUED) {
    queue_.Remove(id);
    CloseFeedLocked(id, absl::CancelledError("cancelled by request"));
    *job->mutable_error() = ErrorOf(absl::CancelledError("cancelled by request while queued"));
    if (absl::Status s = RecordState(*job, v1::CANCELLED); !s.ok()) return s;
    Finished(*job);
    return job;
  }
  auto running = running_.find(id);
  if (running != running_.end()) {
    running->second->by_user = true;
    running->second->cancel = true;
  }
  CloseFeedLocked(id, absl::CancelledError("cancelled by request"));
  if (absl::Status s = RecordState(*job, v1::CANCELLING); !s.ok()) return s;
  log::Info("job cancelling", {{"job_id", id}, {"device", job->device()}});
  return job;
}

std::shared_ptr<StreamFeed> JobManager::FeedLocked(const v1::Job& job) {
  std::shared_ptr<StreamFeed>& feed = feeds_[job.id()];
  if (!feed) {
    feed = std::make_shared<StreamFeed>(job.spec().data().client_stream(), options_.max_batch_bytes);
  }
  return feed;
}

void JobManager::CloseFeedLocked(const std::string& id, const absl::Status& reason) {
  auto feed = feeds_.find(id);
  if (feed == feeds_.end()) return;
  feed->second->Close(reason);
  feeds_.erase(feed);
}

absl::Status JobManager::PushBatch(const std::string& id,
                                   const google::protobuf::RepeatedPtrField<v1::Tensor>& inputs,
                                   bool last) {
  std::shared_ptr<StreamFeed> feed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto job = metadata_->GetJob(id);
    if (!job.ok()) return job.status();
    if (!job->spec().data().has_client_stream()) {
      return absl::FailedPreconditionError(absl::StrCat("job ", id, " does not take a client stream"));
    }
    if (IsTerminal(job->state()) || job->state() == v1::CANCELLING) {
      return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ", v1::JobState_Name(job->state())));
    }
    feed = FeedLocked(*job);
  }
  return feed->Push(inputs, last);  // may block: not under mu_
}

absl::Status JobManager::Watch(const std::string& id, int64_t after_seq,
                               const std::function<bool(const v1::JobEvent&)>& deliver,
                               const std::function<bool()>& stopped) {
  auto job = metadata_->GetJob(id);
  if (!job.ok()) return job.status();
  v1::JobEvent snapshot;
  snapshot.set_seq(after_seq);
  *snapshot.mutable_time() = TimeUtil::GetCurrentTime();
  *snapshot.mutable_snapshot() = *job;
  if (!deliver(snapshot)) return absl::CancelledError("the watcher went away");
  int64_t last = after_seq;
  while (true) {
    const int64_t version = events_.version();
    auto events = metadata_->EventsAfter(id, last, 256);
    if (!events.ok()) return events.status();
    for (const v1::JobEvent& event : *events) {
      if (!deliver(event)) return absl::CancelledError("the watcher went away");
      last = event.seq();
      if (event.kind_case() == v1::JobEvent::kState && IsTerminal(event.state())) {
        return absl::OkStatus();
      }
    }
    if (!events->empty()) continue;
    // Nothing new: a job that ended before after_seq has nothing more to say.
    auto now = metadata_->GetJob(id);
    if (!now.ok()) return now.status();
    if (IsTerminal(now->state())) return absl::OkStatus();
    if (stopping_) return absl::UnavailableError("the server is shutting down; watch again");
    if (stopped && stopped()) return absl::CancelledError("the watcher went away");
    events_.WaitForChange(version, absl::Milliseconds(500));
  }
}

absl::StatusOr<store::ResultRef> JobManager::Result(const std::string& id, v1::Artifact artifact) {
  auto job = metadata_->GetJob(id);
  if (!job.ok()) return job.status();
  if (job->state() != v1::SUCCEEDED) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ",
                                                      v1::JobState_Name(job->state()),
                                                      "; results exist once it has SUCCEEDED"));
  }
  if (artifact == v1::ARTIFACT_UNSPECIFIED) {
    return absl::InvalidArgumentError("artifact must be MODEL, BN_BUFFERS or REPORT");
  }
  return metadata_->GetResult(id, artifact);
}

int JobManager::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(running_.size());
}

void JobManager::WorkerLoop(std::string device) {
  {
    std::lock_guard<std::mutex> lock(workers_mu_);
    ++active_workers_;
  }
  while (!stopping_) {
    std::optional<std::string> id = queue_.Pop();
    if (!id) break;
    RunJob(*id, device);
  }
  {
    std::lock_guard<std::mutex> lock(workers_mu_);
    --active_workers_;
  }
  workers_cv_.notify_all();
}

void JobManager::RunJob(const std::string& id, const std::string& device) {
  auto running = std::make_shared<Running>();
  v1::Job job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto stored = metadata_->GetJob(id);
    if (!stored.ok() || stored->state() != v1::QUEUED) return;  // cancelled meanwhile
    job = *stored;
    job.set_device(device);
    job.set_attempts(job.attempts() + 1);
    *job.mutable_start_time() = TimeUtil::GetCurrentTime();
    job.clear_error();
    if (!RecordState(job, v1::RUNNING).ok()) return;
    running_[id] = running;
  }
  const double queue_wait = SecondsBetween(job.create_time(), job.start_time());
  if (options_.metrics) {
    options_.metrics->job_queue_wait_seconds.Observe(queue_wait);
    options_.metrics->WorkerBusy(device).Increment();
  }
  log::Info("job started", {{"job_id", id},
                            {"device", device},
                            {"attempt", job.attempts()},
                            {"queue_wait_seconds", queue_wait}});
  struct Idle {
    metrics::Metrics* metrics;
    const std::string& device;
    ~Idle() {
      if (metrics) metrics->WorkerBusy(device).Decrement();
    }
  } idle{options_.metrics, device};
  absl::StatusOr<Outputs> outputs = Execute(job, device, *running);

  std::lock_guard<std::mutex> lock(mu_);
  running_.erase(id);
  if (!(running->cancel && !running->by_user)) {  // a job re-queued by shutdown keeps none either
    CloseFeedLocked(id, absl::FailedPreconditionError("the job has ended"));
  }
  auto current = metadata_->GetJob(id);
  if (current.ok()) job = *current;  // keeps progress and a CANCELLING set meanwhile
  if (outputs.ok()) {
    for (const auto& [artifact, ref] : outputs->results) {
      if (absl::Status s = metadata_->PutResult(id, artifact, ref); !s.ok()) {
        outputs = s;
        break;
      }
    }
  }
  if (outputs.ok()) {
    v1::JobEvent summary;
    *summary.mutable_summary() = outputs->report;
    if (RecordEnd(job, summary, v1::SUCCEEDED)) Finished(job);
    return;
  }
  if (running->cancel && !running->by_user) {
    // Shutdown: the job runs again, from the start, when the server next starts.
    job.clear_progress();
    if (RecordEnd(job, std::nullopt, v1::QUEUED)) {
      log::Info("job re-queued: the server is shutting down", {{"job_id", id}});
    }
    return;
  }
  if (running->by_user) {
    *job.mutable_error() = ErrorOf(absl::CancelledError("cancelled by request"));
    if (RecordEnd(job, std::nullopt, v1::CANCELLED)) Finished(job);
    return;
  }
  *job.mutable_error() = ErrorOf(outputs.status());
  v1::JobEvent failure;
  *failure.mutable_failure() = job.error();
  if (RecordEnd(job, failure, v1::FAILED)) Finished(job);
}

bool JobManager::RecordEnd(v1::Job& job, const std::optional<v1::JobEvent>& last_event, v1::JobState state) {
  absl::Status stored;
  bool event_stored = !last_event.has_value();
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(100 << attempt));
    if (!event_stored) {
      stored = Record(job, *last_event);
      event_stored = stored.ok();
      if (!event_stored) continue;
    }
    stored = RecordState(job, state);
    if (stored.ok()) return true;
  }
  // The store keeps the job RUNNING: the next start takes it up again (--max_attempts).
  log::Error("job end not stored", {{"job_id", job.id()},
                                    {"state", v1::JobState_Name(state)},
                                    {"error", std::string(stored.message())}});
  return false;
}

void JobManager::Finished(const v1::Job& job) {
  const bool started = job.has_start_time();
  const double duration = started ? SecondsBetween(job.start_time(), job.end_time()) : 0;
  if (options_.metrics) {
    options_.metrics->JobsFinished(v1::JobState_Name(job.state())).Increment();
    if (started) options_.metrics->job_duration_seconds.Observe(duration);
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

absl::StatusOr<JobManager::Outputs> JobManager::Execute(const v1::Job& job, const std::string& device,
                                                        Running& running) {
  const v1::JobSpec& spec = job.spec();
  auto model_path = models_->PathOf(spec.model_id());
  if (!model_path.ok()) return model_path.status();
  auto data_spec = DataSpecFor(spec.data(), options_.data_roots);
  if (!data_spec.ok()) return data_spec.status();
  const double timeout = spec.timeout_seconds() > 0 ? spec.timeout_seconds() : options_.default_timeout_seconds;

  RunHooks hooks;
  hooks.cancel = &running.cancel;
  hooks.deadline = absl::Now() + absl::Seconds(timeout);
  if (spec.data().has_client_stream()) {
    std::shared_ptr<StreamFeed> feed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      feed = FeedLocked(job);
    }
    feed->set_deadline(std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(timeout)));
    hooks.next_pushed = [feed] { return feed->Next(); };
    hooks.release_pushed = [feed] { feed->Close(absl::FailedPreconditionError("the job has ended")); };
  }

  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
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
    v1::JobEvent event;
    *event.mutable_progress() = progress;
    std::lock_guard<std::mutex> lock(mu_);
    auto current = metadata_->GetJob(job.id());
    if (current.ok()) {
      *current->mutable_progress() = progress;
      Record(*current, event).IgnoreError();
    }
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
    const int64_t total = p.total_samples() > 0
                              ? std::min(p.max_batches(), (p.total_samples() + spec.batch_size() - 1) / spec.batch_size())
                              : p.max_batches();
    const bool last = p.batches() >= total;
    latest = p;
    latest_published_as_final = last;
    if (!last && now - last_event < absl::ToChronoMilliseconds(options_.progress_interval)) return;
    last_event = now;
    publish(p, total);
  };

  namespace fs = std::filesystem;
  const fs::path scratch = fs::path(blobs_->scratch_dir()) / job.id();
  std::error_code error;
  fs::remove_all(scratch, error);  // what an earlier attempt left
  fs::create_directories(scratch, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", scratch.string(), ": ", error.message()));
  absl::Cleanup remove_scratch = [&scratch] {
    std::error_code ignored;
    fs::remove_all(scratch, ignored);
  };

  RecalibrationTask task;
  task.spec = spec;
  task.model_path = *model_path;
  task.data_spec = spec.data().has_client_stream() ? "" : *data_spec;
  task.device = device;
  task.scratch_dir = scratch.string();
  absl::StatusOr<v1::RunReport> report = runner_->Recalibrate(task, hooks);
  if (absl::IsDeadlineExceeded(report.status())) {
    return absl::DeadlineExceededError(absl::StrCat("the job ran past its timeout of ", timeout, " s"));
  }
  if (!report.ok()) return report.status();
  // The data ended before the expected count (skipped files, a stream, early stopping) or
  // the last event was throttled away: the last event says where it really ended.
  if (latest && !latest_published_as_final) publish(*latest, latest->batches());

  Outputs outputs;
  outputs.report = *std::move(report);
  for (const auto& [artifact, name] : {std::pair{v1::MODEL, "model.pt"}, std::pair{v1::BN_BUFFERS, "bn.safetensors"},
                                       std::pair{v1::REPORT, "report.json"}}) {
    // Written by the worker: only plain files are taken (AdoptFile refuses links).
    auto digest = blobs_->AdoptFile((scratch / name).string());
    if (!digest.ok()) return digest.status();
    auto size = blobs_->SizeOf(*digest);
    if (!size.ok()) return size.status();
    outputs.results[artifact] = {*digest, *size};
  }
  return outputs;
}

}  // namespace recal::jobs
