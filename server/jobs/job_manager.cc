#include "server/jobs/job_manager.h"

#include <google/protobuf/util/time_util.h>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/jobs/data_source_spec.h"
#include "server/log/log.h"
#include "server/metrics/metrics.h"

namespace recal::jobs {
namespace {

std::string NewJobId() {
  absl::BitGen gen;
  return absl::StrFormat("job-%016x", absl::Uniform<uint64_t>(gen));
}

const char* DataKind(const v1::JobSpec& spec) {
  if (spec.data().has_client_stream()) return "client_stream";
  if (spec.data().has_synthetic()) return "synthetic";
  if (spec.data().has_tensor_file()) return "tensor_file";
  return "other";
}

}  // namespace

JobManager::JobManager(store::MetadataStore* metadata, store::BlobStore* blobs, ModelRegistry* models,
                       JobRunner* runner, JobManagerOptions options)
    : blobs_(blobs),
      models_(models),
      options_(std::move(options)),
      repository_(metadata, &events_),
      feeds_(options_.max_batch_bytes),
      scheduler_(&repository_, blobs, models, runner, &feeds_, options_.scheduler) {}

JobManager::~JobManager() { Shutdown(absl::Seconds(30)); }

absl::Status JobManager::Start() { return scheduler_.Start(); }

void JobManager::Shutdown(absl::Duration deadline) {
  if (stopping_.exchange(true)) return;
  feeds_.CloseAll(absl::UnavailableError("the server is shutting down"));
  events_.Publish();  // watchers see stopping_
  scheduler_.Shutdown(deadline);
}

absl::Status JobManager::ValidateSpec(const v1::JobSpec& spec) {
  if (spec.model_id().empty()) return absl::InvalidArgumentError("spec.model_id is required");
  auto model = models_->Get(spec.model_id());
  if (!model.ok()) return model.status();
  if (spec.batch_size() < 1 || spec.batch_size() > options_.max_batch_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.batch_size must be in 1..", options_.max_batch_size, ", got ", spec.batch_size()));
  }
  if (spec.options().max_batches() < 0) return absl::InvalidArgumentError("options.max_batches < 0");
  if (spec.options().target_rel_error() < 0) return absl::InvalidArgumentError("options.target_rel_error < 0");
  if (spec.timeout_seconds() < 0) return absl::InvalidArgumentError("spec.timeout_seconds < 0");
  return DataSpecFor(spec.data(), options_.scheduler.data_roots).status();
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::SubmitJobRequest& request) {
  if (stopping_) return absl::UnavailableError("the server is shutting down");
  if (absl::Status valid = ValidateSpec(request.spec()); !valid.ok()) return valid;
  // One submission at a time past this point, so that the queue's bound holds.
  std::lock_guard<std::mutex> lock(submit_mu_);
  if (absl::Status room = scheduler_.CheckCapacity(); !room.ok()) return room;
  v1::Job job;
  job.set_id(NewJobId());
  job.set_request_id(request.request_id());
  *job.mutable_spec() = request.spec();
  bool created = false;
  auto stored = repository_.Create(job, &created);
  if (!stored.ok() || !created) return stored;
  if (options_.scheduler.metrics) options_.scheduler.metrics->jobs_submitted.Increment();
  log::Info("job submitted", {{"job_id", stored->id()},
                              {"model_id", stored->spec().model_id()},
                              {"data", DataKind(stored->spec())},
                              {"batch_size", stored->spec().batch_size()},
                              {"priority", stored->spec().priority()}});
  scheduler_.Enqueue(*stored);
  return stored;
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& id) { return repository_.Get(id); }

absl::StatusOr<store::JobPage> JobManager::List(const std::vector<v1::JobState>& states, int page_size,
                                                const std::string& page_token) {
  return repository_.List(states, page_size, page_token);
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& id) {
  auto job = repository_.Cancel(id, "cancelled by request");
  if (!job.ok()) return job;
  if (job->state() != v1::CANCELLED && job->state() != v1::CANCELLING) return job;  // it had ended
  scheduler_.Cancel(id);
  feeds_.Close(id, absl::CancelledError("cancelled by request"));
  if (job->state() == v1::CANCELLED) {
    JobFinished(*job, options_.scheduler.metrics);
  } else {
    log::Info("job cancelling", {{"job_id", id}, {"device", job->device()}});
  }
  return job;
}

absl::Status JobManager::PushBatch(const std::string& id, const google::protobuf::RepeatedPtrField<v1::Tensor>& inputs,
                                   bool last) {
  auto job = repository_.Get(id);
  if (!job.ok()) return job.status();
  if (!job->spec().data().has_client_stream()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " does not take a client stream"));
  }
  std::shared_ptr<StreamFeed> feed = feeds_.Find(id);
  if (IsTerminal(job->state()) || job->state() == v1::CANCELLING || !feed) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ", v1::JobState_Name(job->state())));
  }
  return feed->Push(inputs, last);  // may block (back-pressure)
}

absl::Status JobManager::Watch(const std::string& id, int64_t after_seq,
                               const std::function<bool(const v1::JobEvent&)>& deliver,
                               const std::function<bool()>& stopped) {
  auto job = repository_.Get(id);
  if (!job.ok()) return job.status();
  v1::JobEvent snapshot;
  snapshot.set_seq(after_seq);
  *snapshot.mutable_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  *snapshot.mutable_snapshot() = *job;
  if (!deliver(snapshot)) return absl::CancelledError("the watcher went away");
  int64_t last = after_seq;
  while (true) {
    const int64_t version = events_.version();
    auto events = repository_.EventsAfter(id, last, 256);
    if (!events.ok()) return events.status();
    for (const v1::JobEvent& event : *events) {
      if (!deliver(event)) return absl::CancelledError("the watcher went away");
      last = event.seq();
      if (event.kind_case() == v1::JobEvent::kState && IsTerminal(event.state())) return absl::OkStatus();
    }
    if (!events->empty()) continue;
    // Nothing new: a job that ended before after_seq has nothing more to say.
    auto now = repository_.Get(id);
    if (!now.ok()) return now.status();
    if (IsTerminal(now->state())) return absl::OkStatus();
    if (stopping_) return absl::UnavailableError("the server is shutting down; watch again");
    if (stopped && stopped()) return absl::CancelledError("the watcher went away");
    events_.WaitForChange(version, absl::Milliseconds(500));
  }
}

absl::StatusOr<store::ResultRef> JobManager::Result(const std::string& id, v1::Artifact artifact) {
  auto job = repository_.Get(id);
  if (!job.ok()) return job.status();
  if (job->state() != v1::SUCCEEDED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is ", v1::JobState_Name(job->state()), "; results exist once it has SUCCEEDED"));
  }
  if (artifact == v1::ARTIFACT_UNSPECIFIED) {
    return absl::InvalidArgumentError("artifact must be MODEL, BN_BUFFERS or REPORT");
  }
  return repository_.Result(id, artifact);
}

absl::StatusOr<JobManager::OpenedResult> JobManager::OpenResult(const std::string& id, v1::Artifact artifact) {
  auto ref = Result(id, artifact);
  if (!ref.ok()) return ref.status();
  auto reader = blobs_->OpenReader(ref->sha256);
  if (absl::IsNotFound(reader.status())) {
    return absl::DataLossError(absl::StrCat("the ", v1::Artifact_Name(artifact), " of job ", id, " (blob sha256:",
                                            ref->sha256, ") is missing from the blob store"));
  }
  if (!reader.ok()) return reader.status();
  return OpenedResult{*std::move(ref), *std::move(reader)};
}

}  // namespace recal::jobs
