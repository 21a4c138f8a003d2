#include "server/jobs/job_manager.h"

#include <chrono>
#include <filesystem>
#include <optional>

#include <google/protobuf/util/time_util.h>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/data/batch_source.h"
#include "server/engine/recalibration.h"
#include "server/engine/report.h"
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

engine::Options EngineOptionsOf(const v1::JobSpec& spec, const std::string& device, int threads) {
  engine::Options options;
  const v1::EngineOptions& o = spec.options();
  if (o.estimator() != v1::ESTIMATOR_UNSPECIFIED) options.estimator = o.estimator();
  if (o.modules() != v1::MODULE_MODE_UNSPECIFIED) options.modules = o.modules();
  options.include = o.include();
  options.exclude = o.exclude();
  if (o.max_batches() > 0) options.max_batches = o.max_batches();
  options.allow_short_data = o.allow_short_data();
  options.target_rel_error = o.target_rel_error();
  options.device = device;
  options.threads = threads;
  return options;
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
                       ModelRegistry* models, JobManagerOptions options)
    : metadata_(metadata),
      blobs_(blobs),
      models_(models),
      options_(std::move(options)),
      queue_(options_.max_queued_jobs) {}

JobManager::~JobManager() { Shutdown(absl::Seconds(30)); }

absl::Status JobManager::Record(const v1::Job& job, v1::JobEvent event) {
  auto stored = metadata_->UpdateJob(job, std::move(event));
  if (!stored.ok()) return stored.status();
  {
    std::lock_guard<std::mutex> lock(events_mu_);
    ++events_version_;
  }
  events_cv_.notify_all();
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
    const v1::JobState next = job.state() == v1::CANCELLING ? v1::CANCELLED : v1::QUEUED;
    if (next == v1::CANCELLED) *job.mutable_error() = ErrorOf(absl::CancelledError("cancelled"));
    job.clear_progress();
    if (absl::Status s = RecordState(job, next); !s.ok()) return s;
    if (next == v1::CANCELLED) {
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
  {
    std::lock_guard<std::mutex> lock(events_mu_);
    ++events_version_;
  }
  events_cv_.notify_all();
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
    int64_t version;
    {
      std::lock_guard<std::mutex> lock(events_mu_);
      version = events_version_;
    }
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
    std::unique_lock<std::mutex> lock(events_mu_);
    events_cv_.wait_for(lock, std::chrono::milliseconds(500),
                        [&] { return events_version_ != version; });
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
    Record(job, summary).IgnoreError();
    RecordState(job, v1::SUCCEEDED).IgnoreError();
    Finished(job);
    return;
  }
  if (running->cancel && !running->by_user) {
    // Shutdown: the job runs again, from the start, when the server next starts.
    job.clear_progress();
    RecordState(job, v1::QUEUED).IgnoreError();
    log::Info("job re-queued: the server is shutting down", {{"job_id", id}});
    return;
  }
  if (running->by_user) {
    *job.mutable_error() = ErrorOf(absl::CancelledError("cancelled by request"));
    RecordState(job, v1::CANCELLED).IgnoreError();
    Finished(job);
    return;
  }
  *job.mutable_error() = ErrorOf(outputs.status());
  v1::JobEvent failure;
  *failure.mutable_failure() = job.error();
  Record(job, failure).IgnoreError();
  RecordState(job, v1::FAILED).IgnoreError();
  Finished(job);
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
  std::optional<int64_t> samples;
  std::function<absl::StatusOr<std::optional<data::Batch>>()> next_batch;
  std::unique_ptr<data::BatchSource> file_batches;
  if (spec.data().has_client_stream()) {
    std::shared_ptr<StreamFeed> feed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      feed = FeedLocked(job);
    }
    const double timeout = spec.timeout_seconds() > 0 ? spec.timeout_seconds() : options_.default_timeout_seconds;
    feed->set_deadline(std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(timeout)));
    next_batch = [feed] { return feed->Next(); };
  } else {
    const data::InputOptions input{.prefetch_depth = options_.prefetch_depth,
                                   .decode_threads = options_.decode_threads,
                                   .pin_memory = absl::StartsWith(device, "cuda"),
                                   .data_roots = options_.data_roots};
    auto source = data::OpenBatchSource(*data_spec, spec.batch_size(), input);
    if (!source.ok()) return source.status();
    samples = (*source)->num_samples();
    file_batches = *std::move(source);
    next_batch = [&] { return file_batches->Next(); };
  }

  auto run = engine::Recalibration::Create(*model_path, EngineOptionsOf(spec, device, options_.threads_per_worker));
  if (!run.ok()) return run.status();

  const double timeout = spec.timeout_seconds() > 0 ? spec.timeout_seconds() : options_.default_timeout_seconds;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto next = [&]() -> absl::StatusOr<std::optional<std::vector<at::Tensor>>> {
    if (elapsed() > timeout) {
      return absl::DeadlineExceededError(absl::StrCat("the job ran past its timeout of ", timeout, " s"));
    }
    return next_batch();
  };
  auto last_event = std::chrono::steady_clock::now() - std::chrono::hours(1);
  int64_t counted_batches = 0, counted_samples = 0;
  auto publish = [&](const engine::Progress& p, int64_t total) {
    v1::Job update = job;
    v1::JobProgress* progress = update.mutable_progress();
    progress->set_batches_done(p.batches);
    progress->set_batches_total(total);
    progress->set_samples_done(p.samples);
    const double rate = elapsed() > 0 ? p.samples / elapsed() : 0;
    progress->set_samples_per_second(rate);
    progress->set_eta_seconds(p.batches > 0 ? elapsed() / p.batches * (total - p.batches) : 0);
    progress->set_rel_std_error(std::isfinite(p.rel_std_error) ? p.rel_std_error : -1);
    v1::JobEvent event;
    *event.mutable_progress() = *progress;
    std::lock_guard<std::mutex> lock(mu_);
    auto current = metadata_->GetJob(job.id());
    if (current.ok()) {
      *current->mutable_progress() = *progress;
      Record(*current, event).IgnoreError();
    }
  };
  std::optional<engine::Progress> latest;
  bool latest_published_as_final = false;
  auto on_progress = [&](const engine::Progress& p) {
    if (options_.metrics) {
      options_.metrics->batches_processed.Increment(static_cast<double>(p.batches - counted_batches));
      options_.metrics->samples_processed.Increment(static_cast<double>(p.samples - counted_samples));
    }
    counted_batches = p.batches;
    counted_samples = p.samples;
    const auto now = std::chrono::steady_clock::now();
    const int64_t total = samples ? std::min(p.max_batches, (*samples + spec.batch_size() - 1) / spec.batch_size())
                                  : p.max_batches;
    const bool last = p.batches >= total;
    latest = p;
    latest_published_as_final = last;
    if (!last && now - last_event < absl::ToChronoMilliseconds(options_.progress_interval)) return;
    last_event = now;
    publish(p, total);
  };
  absl::Status ran = (*run)->Run(next, on_progress, &running.cancel);
  if (!ran.ok()) return ran;
  // The data ended before the expected count (skipped files, a stream, early stopping) or
  // the last event was throttled away: the last event says where it really ended.
  if (latest && !latest_published_as_final) publish(*latest, latest->batches);

  namespace fs = std::filesystem;
  const fs::path scratch = fs::path(blobs_->scratch_dir()) / job.id();
  std::error_code error;
  fs::create_directories(scratch, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", scratch.string(), ": ", error.message()));
  Outputs outputs;
  outputs.report = (*run)->Report();
  outputs.report.set_model(spec.model_id());
  outputs.report.set_data(*data_spec);
  outputs.report.set_batch_size(spec.batch_size());
  if (file_batches) outputs.report.set_skipped_files(file_batches->skipped_files());
  const std::string model_file = (scratch / "model.pt").string();
  const std::string bn_file = (scratch / "bn.safetensors").string();
  const std::string report_file = (scratch / "report.json").string();
  absl::Status written = (*run)->WriteModel(model_file);
  if (written.ok()) written = (*run)->WriteBatchNormBuffers(bn_file);
  if (written.ok()) written = engine::WriteReportJson(report_file, outputs.report);
  for (const auto& [artifact, file] : {std::pair{v1::MODEL, model_file}, std::pair{v1::BN_BUFFERS, bn_file},
                                       std::pair{v1::REPORT, report_file}}) {
    if (!written.ok()) break;
    auto digest = blobs_->AdoptFile(file);
    if (!digest.ok()) {
      written = digest.status();
      break;
    }
    auto size = blobs_->SizeOf(*digest);
    if (!size.ok()) {
      written = size.status();
      break;
    }
    outputs.results[artifact] = {*digest, *size};
  }
  fs::remove_all(scratch, error);
  if (!written.ok()) return written;
  return outputs;
}

}  // namespace recal::jobs
