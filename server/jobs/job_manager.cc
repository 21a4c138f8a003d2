#include "server/jobs/job_manager.h"

#include <google/protobuf/util/time_util.h>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/now.h"
#include "common/status_macros.h"
#include "server/jobs/batch_assembler.h"
#include "server/jobs/job_plan.h"
#include "server/jobs/job_wait.h"
#include "server/jobs/storage.h"
#include "server/log/log.h"
#include "server/metrics/metrics.h"
#include "recal/v1/report.pb.h"

namespace recal::jobs {
namespace {

std::string NewJobId() {
  absl::BitGen gen;
  return absl::StrFormat("job-%016x", absl::Uniform<uint64_t>(gen));
}

// Each tenant's bound on running jobs: the scheduler's own, or else from `limits`, read at each
// claim (a reloaded auth file applies at once).
store::MaxRunningJobs RunningBound(const JobManagerOptions& options) {
  if (options.scheduler.max_running_jobs || !options.limits) return options.scheduler.max_running_jobs;
  return [limits = options.limits](const std::string& tenant) { return limits(tenant).max_running_jobs; };
}

SchedulerOptions WithRunningBound(SchedulerOptions options, store::MaxRunningJobs bound) {
  options.max_running_jobs = std::move(bound);
  return options;
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
    : metadata_(metadata),
      blobs_(blobs),
      models_(models),
      options_(std::move(options)),
      max_running_(RunningBound(options_)),
      repository_(metadata, &events_),
      feeds_(options_.max_batch_bytes),
      scheduler_(&repository_, blobs, models, runner, &feeds_, WithRunningBound(options_.scheduler, max_running_)) {
  change_watch_ = metadata->WatchChanges([this] {
    events_.PublishAll();  // the notification does not say which job
    scheduler_.Wake();
  });
}

JobManager::~JobManager() { Shutdown(absl::Seconds(30)); }

absl::Status JobManager::Start() {
  recheck_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(recheck_mu_);
    while (!recheck_stop_.wait_for(lock, absl::ToChronoMilliseconds(options_.watch_recheck),
                                   [this] { return stopping_.load(); })) {
      events_.PublishAll();
    }
  });
  return scheduler_.Start();
}

void JobManager::Shutdown(absl::Duration deadline) {
  if (stopping_.exchange(true)) return;
  change_watch_.reset();
  feeds_.CloseAll(absl::UnavailableError("the server is shutting down"));
  if (options_.relay != nullptr) options_.relay->CloseAll();
  {
    std::lock_guard<std::mutex> lock(recheck_mu_);  // the recheck thread sees stopping_
  }
  recheck_stop_.notify_all();
  if (recheck_.joinable()) recheck_.join();
  events_.PublishAll();  // watchers see stopping_
  scheduler_.Shutdown(deadline);
}

absl::StatusOr<worker::v1::JobPlan> JobManager::PlanWithinLimits(const std::string& tenant, const v1::JobSpec& spec) {
  if (spec.batch_size() < 1 || spec.batch_size() > options_.max_batch_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.batch_size must be in 1..", options_.max_batch_size, ", got ", spec.batch_size()));
  }
  if (spec.timeout_seconds() < 0) return absl::InvalidArgumentError("spec.timeout_seconds < 0");
  if (spec.shards() < 0 || spec.shards() > options_.max_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.shards must be in 0..", options_.max_shards, ", got ", spec.shards()));
  }
  if (spec.data().has_client_stream() && !options_.client_streams) {
    return absl::UnimplementedError(
        "client_stream jobs need a server running with --role=all, or api replicas and workers started with "
        "--internal_token_file (the cluster secret), which relay pushed batches to the worker running the job");
  }
  return PlanJob(spec, options_.scheduler.data_roots.For(tenant));
}

absl::StatusOr<v1::Job> JobManager::Visible(const Caller& caller, const std::string& id) {
  auto job = repository_.Get(id);
  if (job.ok() && !caller.Sees(job->tenant())) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return job;
}

store::JobQuota JobManager::QuotaOf(const std::string& tenant) const {
  store::JobQuota quota;
  // The model Submit resolved must still be there when the job is stored (the retention
  // sweeper and deletions decide in their own transaction whether a job uses it).
  quota.model_must_exist = true;
  if (!options_.limits) return quota;
  const TenantLimits limits = options_.limits(tenant);
  quota.max_active_jobs = limits.max_active_jobs;
  quota.max_submissions_per_minute = limits.max_submissions_per_minute;
  return quota;
}

absl::StatusOr<v1::Job> JobManager::Submit(const Caller& caller, const v1::SubmitJobRequest& request) {
  if (stopping_) return absl::UnavailableError("the server is shutting down");
  if (request.spec().model_id().empty()) return absl::InvalidArgumentError("spec.model_id is required");
  // The model is resolved once, here: the job keeps its full id, and so runs these bytes
  // whatever is uploaded under the name after.
  RECAL_ASSIGN_OR_RETURN(const v1::Model model, models_->Resolve(caller.tenant, request.spec().model_id()));
  v1::JobSpec spec = request.spec();
  spec.set_model_id(model.id());
  RECAL_ASSIGN_OR_RETURN(const worker::v1::JobPlan plan, PlanWithinLimits(caller.tenant, spec));
  RECAL_RETURN_IF_ERROR(CheckPlanFitsModel(plan, model));
  // One submission at a time past this point, so that the queue's bound holds. The tenant's
  // quotas are the store's to check, in the transaction that creates the job, so that they
  // hold across api replicas too.
  std::lock_guard<std::mutex> lock(submit_mu_);
  v1::Job job;
  job.set_id(NewJobId());
  job.set_tenant(caller.tenant);
  job.set_request_id(request.request_id());
  *job.mutable_spec() = std::move(spec);
  if (!request.request_id().empty()) {
    // A retried submission is answered with its job, the queue full or not (and over quota
    // or not: the store looks it up before it counts).
    auto existing = repository_.FindByRequestId(caller.tenant, request.request_id());
    if (existing.ok()) return existing;
    if (!absl::IsNotFound(existing.status())) return existing.status();
  }
  if (absl::Status room = scheduler_.CheckCapacity(); !room.ok()) return room;
  bool created = false;
  auto stored = repository_.Create(job, plan, &created, QuotaOf(caller.tenant));
  if (!stored.ok() || !created) return stored;
  if (options_.scheduler.metrics) options_.scheduler.metrics->JobsSubmitted(stored->tenant()).Increment();
  log::Info("job submitted", {{"job_id", stored->id()},
                              {"tenant", stored->tenant()},
                              {"model_id", stored->spec().model_id()},
                              {"data", DataKind(stored->spec())},
                              {"batch_size", stored->spec().batch_size()},
                              {"priority", stored->spec().priority()}});
  scheduler_.Enqueue(*stored);
  return stored;
}

absl::StatusOr<v1::Job> JobManager::Get(const Caller& caller, const std::string& id) {
  RECAL_ASSIGN_OR_RETURN(v1::Job job, Visible(caller, id));
  if (job.state() == v1::QUEUED) RECAL_RETURN_IF_ERROR(FillWait(job));
  return job;
}

absl::Status JobManager::FillWait(v1::Job& job) {
  const absl::Time now = absl::Now();
  RECAL_ASSIGN_OR_RETURN(const store::QueueCounts counts,
                         metadata_->CountQueue(job.id(), absl::ToUnixMillis(now - store::kWorkerEndpointLiveWithin),
                                               absl::ToUnixMillis(now)));
  const int64_t bound = max_running_ ? max_running_(job.tenant()) : 0;
  // This process's own workers (role all) count whether or not the store heard of them.
  *job.mutable_wait() = DescribeWait(job, counts, bound, !options_.scheduler.devices.empty());
  return absl::OkStatus();
}

absl::StatusOr<store::JobPage> JobManager::List(const std::string& tenant, const std::vector<v1::JobState>& states,
                                                int page_size, const std::string& page_token) {
  return repository_.List(tenant, states, page_size, page_token);
}

absl::StatusOr<v1::Job> JobManager::Cancel(const Caller& caller, const std::string& id) {
  if (auto visible = Visible(caller, id); !visible.ok()) return visible;
  auto job = repository_.Cancel(id, "cancelled by request");
  if (!job.ok()) return job;
  if (job->state() != v1::CANCELLED && job->state() != v1::CANCELLING) return job;  // it had ended
  scheduler_.Cancel(id);
  feeds_.Close(id, absl::CancelledError("cancelled by request"));
  if (store::IsCoordinated(*job)) {
    // Its coordinator stops them too; this is for a job cancelled before one took it up.
    auto shards = repository_.Children(id);
    if (shards.ok()) scheduler_.CancelShards(*shards, "the sharded job was cancelled");
  }
  if (job->state() == v1::CANCELLED) {
    JobFinished(*job, options_.scheduler.metrics);
  } else {
    log::Info("job cancelling", {{"job_id", id}, {"device", job->device()}});
  }
  return job;
}

absl::StatusOr<JobManager::Deleted> JobManager::Delete(const Caller& caller, const std::string& id) {
  RECAL_ASSIGN_OR_RETURN(v1::Job job, Visible(caller, id));
  RECAL_ASSIGN_OR_RETURN(const std::vector<store::ResultRef> results, metadata_->DeleteJob(id));
  Deleted deleted{std::move(job)};
  for (const store::ResultRef& result : results) {
    deleted.result_bytes += result.size;
    RECAL_RETURN_IF_ERROR(RemoveBlobIfUnreferenced(*metadata_, *blobs_, result.sha256));
  }
  log::Info("job deleted", {{"job_id", id}, {"tenant", deleted.job.tenant()}, {"result_bytes", deleted.result_bytes}});
  return deleted;
}

absl::StatusOr<JobManager::PushTarget> JobManager::FindPushTarget(const Caller& caller, const std::string& id,
                                                                  int shard) {
  auto job = Visible(caller, id);
  if (!job.ok()) return job.status();
  if (!job->spec().data().has_client_stream()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " does not take a client stream"));
  }
  const int shards = store::IsCoordinated(*job) ? job->spec().shards() : 1;
  if (shard < 0 || shard >= shards) {
    return absl::InvalidArgumentError(absl::StrCat("job ", id, " has ", shards, " shard", shards > 1 ? "s" : "",
                                                   "; there is no shard ", shard));
  }
  return PushTarget{*std::move(job), shards > 1 ? ShardJobId(id, shard) : id};
}

absl::Status JobManager::PushBatch(const Caller& caller, const std::string& id, int shard,
                                   google::protobuf::RepeatedPtrField<v1::Tensor>& inputs, bool last) {
  auto target = FindPushTarget(caller, id, shard);
  if (!target.ok()) return target.status();
  const v1::Job* job = &target->job;
  const std::string& feed_id = target->feed_id;
  if (feed_id != id) {
    auto child = repository_.Get(feed_id);
    if (!child.ok()) return child.status();
    if (IsTerminal(child->state()) || child->state() == v1::CANCELLING) {
      return absl::FailedPreconditionError(absl::StrCat("shard ", shard, " of job ", id, " is ",
                                                        v1::JobState_Name(child->state())));
    }
  }
  std::shared_ptr<StreamFeed> feed = feeds_.Find(feed_id);
  if (IsTerminal(job->state()) || job->state() == v1::CANCELLING || !feed) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is ", v1::JobState_Name(job->state())));
  }
  return feed->Push(inputs, last);  // may block (back-pressure)
}

namespace {

// Role all: every whole batch through JobManager::PushBatch, its parts joined first.
class LocalPush final : public PushStream {
 public:
  using PushFn = std::function<absl::Status(google::protobuf::RepeatedPtrField<v1::Tensor>&, bool)>;
  LocalPush(PushFn push, int64_t max_batch_bytes) : push_(std::move(push)), assembler_(max_batch_bytes) {}
  absl::Status Push(v1::PushBatchesRequest& message) override {
    RECAL_ASSIGN_OR_RETURN(v1::PushBatchesRequest* const batch, assembler_.Add(message));
    if (batch == nullptr) return absl::OkStatus();
    return push_(*batch->mutable_inputs(), batch->last());
  }
  absl::Status Finish() override { return assembler_.Finish(); }

 private:
  const PushFn push_;
  BatchAssembler assembler_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PushStream>> JobManager::OpenPush(const Caller& caller, const std::string& id,
                                                                 int shard, const std::function<bool()>& stopped) {
  if (options_.relay == nullptr) {
    return std::make_unique<LocalPush>(
        [this, caller, id, shard](google::protobuf::RepeatedPtrField<v1::Tensor>& inputs, bool last) {
          return PushBatch(caller, id, shard, inputs, last);
        },
        options_.max_batch_bytes);
  }
  auto target = FindPushTarget(caller, id, shard);
  if (!target.ok()) return target.status();
  auto address = RelayTarget(id, target->feed_id, stopped);
  if (!address.ok()) return address.status();
  return options_.relay->Open(*address, target->feed_id);
}

absl::StatusOr<std::string> JobManager::RelayTarget(const std::string& id, const std::string& feed_id,
                                                    const std::function<bool()>& stopped) {
  const absl::Time deadline = absl::Now() + options_.relay_wait;
  while (true) {
    const int64_t version = events_.version();
    auto stored = repository_.Read(feed_id);
    if (!stored.ok()) return stored.status();
    const v1::JobState state = stored->job.state();
    if (IsTerminal(state) || state == v1::CANCELLING) {
      return absl::FailedPreconditionError(absl::StrCat("job ", feed_id, " is ", v1::JobState_Name(state)));
    }
    absl::Duration poll = absl::Milliseconds(500);
    if (state == v1::RUNNING && !stored->lease_owner.empty()) {
      // The address is the one the worker process holding the lease recorded: a client names
      // a job, never where to connect.
      auto address = repository_.WorkerEndpoint(stored->lease_owner);
      if (address.ok()) return address;
      if (!absl::IsNotFound(address.status())) return address.status();
      poll = absl::Milliseconds(100);  // claimed a moment ago: its endpoint is being recorded
    }
    if (stopping_) return absl::UnavailableError("the server is shutting down; push again");
    if (stopped && stopped()) return absl::CancelledError("the client went away");
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "job ", id, " has not been taken up by a worker within ", absl::FormatDuration(options_.relay_wait),
          " (it is ", v1::JobState_Name(state), "); nothing was consumed: push again, from the first batch"));
    }
    events_.WaitForChange(version, std::min(poll, deadline - absl::Now()));
  }
}

absl::StatusOr<std::shared_ptr<StreamFeed>> JobManager::RelayedFeed(const std::string& feed_id, absl::Duration wait) {
  std::shared_ptr<StreamFeed> feed = feeds_.Await(feed_id, absl::ToChronoMilliseconds(wait));
  if (!feed) return absl::FailedPreconditionError(absl::StrCat("job ", feed_id, " does not run on this worker"));
  return feed;
}

absl::StatusOr<std::unique_ptr<WatchCursor>> JobManager::OpenWatch(const Caller& caller, const std::string& id,
                                                                    int64_t after_seq) {
  // The snapshot says why a queued job waits, as GetJob does.
  RECAL_ASSIGN_OR_RETURN(v1::Job job, Get(caller, id));
  return std::make_unique<WatchCursor>(&watch_reads_, std::move(job), after_seq);
}

absl::StatusOr<store::ResultRef> JobManager::Result(const Caller& caller, const std::string& id,
                                                    v1::Artifact artifact) {
  auto job = Visible(caller, id);
  if (!job.ok()) return job.status();
  if (job->state() != v1::SUCCEEDED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " is ", v1::JobState_Name(job->state()), "; results exist once it has SUCCEEDED"));
  }
  if (artifact == v1::ARTIFACT_UNSPECIFIED) {
    return absl::InvalidArgumentError("artifact must be MODEL, BN_BUFFERS, REPORT or FOLDED");
  }
  if (artifact == v1::FOLDED && !job->spec().options().fold_batch_norm()) {
    return absl::NotFoundError(absl::StrCat("job ", id, " made no folded model: submit it with options.fold_batch_norm "
                                            "(recalctl --fold_batch_norm) to have one"));
  }
  return repository_.Result(id, artifact);
}

absl::StatusOr<JobManager::OpenedResult> JobManager::OpenResult(const Caller& caller, const std::string& id,
                                                                v1::Artifact artifact) {
  auto ref = Result(caller, id, artifact);
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
