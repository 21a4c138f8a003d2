#include "server/jobs/job_repository.h"

#include <google/protobuf/util/time_util.h>

#include "absl/strings/str_cat.h"
#include "common/now.h"
#include "common/status_macros.h"
#include "absl/time/clock.h"

namespace recal::jobs {
namespace {

using google::protobuf::util::TimeUtil;

v1::JobError ErrorOf(const absl::Status& status) {
  v1::JobError error;
  error.set_code(static_cast<int>(status.code()));
  error.set_message(std::string(status.message()));
  return error;
}

absl::Status NotIn(const v1::Job& job, const char* what) {
  return absl::FailedPreconditionError(
      absl::StrCat("job ", job.id(), " is ", v1::JobState_Name(job.state()), "; it cannot ", what));
}

bool Runs(v1::JobState state) { return state == v1::RUNNING || state == v1::CANCELLING; }

}  // namespace

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

std::string ShardJobId(const std::string& parent_id, int index) { return absl::StrCat(parent_id, "-s", index); }

JobRepository::JobRepository(store::MetadataStore* metadata, EventHub* events)
    : metadata_(metadata), events_(events) {}

absl::StatusOr<v1::Job> JobRepository::Create(v1::Job job, const worker::v1::JobPlan& plan, bool* created,
                                              store::JobQuota quota) {
  job.set_state(v1::QUEUED);
  job.set_attempts(0);
  job.clear_progress();
  job.clear_error();
  job.clear_start_time();
  job.clear_end_time();
  *job.mutable_create_time() = NowTimestamp();
  if (quota.now_ms == 0) quota.now_ms = TimeUtil::TimestampToMilliseconds(job.create_time());
  v1::JobEvent queued;
  queued.set_state(v1::QUEUED);
  const std::string plan_bytes = plan.SerializeAsString();
  std::vector<store::NewJob> children;
  if (store::IsCoordinated(job)) {
    for (int k = 0; k < job.spec().shards(); ++k) {
      v1::Job shard = job;
      shard.set_id(ShardJobId(job.id(), k));
      shard.clear_request_id();
      shard.set_parent_id(job.id());
      shard.set_shard(k);
      children.push_back({std::move(shard), {queued}, plan_bytes});
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto stored = metadata_->CreateJob(job, created, {queued}, std::move(children), quota, plan_bytes);
  if (!stored.ok() || !*created) return stored;
  events_->Publish(job.id());
  return stored;
}

absl::StatusOr<v1::Job> JobRepository::Get(const std::string& id) { return metadata_->GetJob(id); }

absl::StatusOr<std::optional<worker::v1::JobPlan>> JobRepository::Plan(const std::string& id) {
  RECAL_ASSIGN_OR_RETURN(const std::string bytes, metadata_->JobPlan(id));
  if (bytes.empty()) return std::nullopt;
  worker::v1::JobPlan plan;
  if (!plan.ParseFromString(bytes)) return absl::DataLossError(absl::StrCat("the stored plan of job ", id, " is unreadable"));
  return plan;
}

absl::StatusOr<std::vector<v1::Job>> JobRepository::Children(const std::string& parent_id) {
  return metadata_->ChildJobs(parent_id);
}

absl::StatusOr<v1::Job> JobRepository::FindByRequestId(const std::string& tenant, const std::string& request_id) {
  return metadata_->FindJobByRequestId(tenant, request_id);
}

absl::StatusOr<store::JobPage> JobRepository::List(const std::string& tenant, const std::vector<v1::JobState>& states,
                                                   int page_size, const std::string& page_token) {
  return metadata_->ListJobs(tenant, states, page_size, page_token);
}

absl::StatusOr<std::vector<v1::Job>> JobRepository::InStates(const std::vector<v1::JobState>& states) {
  return metadata_->JobsInStates(states);
}

absl::StatusOr<std::vector<v1::JobEvent>> JobRepository::EventsAfter(const std::string& id, int64_t after_seq,
                                                                      int limit) {
  return metadata_->EventsAfter(id, after_seq, limit);
}

absl::StatusOr<store::ResultRef> JobRepository::Result(const std::string& id, v1::Artifact artifact) {
  return metadata_->GetResult(id, artifact);
}

absl::StatusOr<store::StoredJob> JobRepository::Read(const std::string& id) { return metadata_->ReadJob(id); }

absl::StatusOr<std::string> JobRepository::WorkerEndpoint(const std::string& owner) {
  return metadata_->WorkerEndpoint(owner);
}

absl::Status JobRepository::RecordWorkerEndpoint(const std::string& owner, const std::string& address) {
  return metadata_->PutWorkerEndpoint(owner, address, absl::ToUnixMillis(absl::Now()));
}

namespace {

// Adds the state event of a change of state (and the end time of an end).
void NoteStateChange(v1::JobState before, v1::Job& job, std::vector<v1::JobEvent>& events) {
  if (job.state() == before) return;
  if (IsTerminal(job.state())) *job.mutable_end_time() = NowTimestamp();
  v1::JobEvent state;
  state.set_state(job.state());
  events.push_back(std::move(state));
}

}  // namespace

absl::StatusOr<v1::Job> JobRepository::Transition(const std::string& id, const Change& change,
                                                  const std::map<v1::Artifact, store::ResultRef>& results,
                                                  const std::string& owner, int64_t expected_version) {
  std::lock_guard<std::mutex> lock(mu_);
  // Another process may change the job between the read and the write: the write is a
  // compare-and-set on the version read, and a lost race reads again.
  for (int race = 0;; ++race) {
    auto stored = metadata_->ReadJob(id);
    if (!stored.ok()) return stored.status();
    if (expected_version >= 0 && stored->version != expected_version) {
      return absl::AbortedError(absl::StrCat("job ", id, " changed meanwhile"));
    }
    if (!owner.empty() && stored->lease_owner != owner) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " is no longer leased to ", owner, " (its lease expired; it was taken up again)"));
    }
    v1::Job& job = stored->job;
    const v1::JobState before = job.state();
    std::vector<v1::JobEvent> events;
    if (absl::Status s = change(job, events); !s.ok()) return s;
    NoteStateChange(before, job, events);
    if (events.empty() && results.empty()) return job;
    absl::Status written = metadata_->CommitJob(job, std::move(events), results, stored->version);
    if (absl::IsAborted(written) && expected_version < 0 && race < 10) continue;
    if (!written.ok()) return written;
    events_->Publish(job.id());
    // A shard's change may change what its parent's watchers see.
    if (!job.parent_id().empty()) events_->Publish(job.parent_id());
    return job;
  }
}

absl::StatusOr<v1::Job> JobRepository::TransitionRetried(const std::string& id, const Change& change,
                                                         const std::map<v1::Artifact, store::ResultRef>& results,
                                                         const std::string& owner) {
  absl::StatusOr<v1::Job> job;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(100 << attempt));
    job = Transition(id, change, results, owner);
    // The transition itself refused (not the store): trying again changes nothing.
    if (job.ok() || absl::IsFailedPrecondition(job.status()) || absl::IsNotFound(job.status())) break;
  }
  return job;
}

namespace {

// QUEUED -> RUNNING, the same for Start and Claim.
absl::Status StartOn(const std::string& device, v1::Job& job) {
  if (job.state() != v1::QUEUED) return NotIn(job, "start");
  job.set_state(v1::RUNNING);
  job.set_device(device);
  job.set_attempts(job.attempts() + 1);
  *job.mutable_start_time() = NowTimestamp();
  job.clear_error();
  job.clear_progress();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::Job> JobRepository::Start(const std::string& id, const std::string& device) {
  return Transition(id, [&](v1::Job& job, std::vector<v1::JobEvent>&) { return StartOn(device, job); });
}

absl::StatusOr<std::optional<v1::Job>> JobRepository::Claim(const std::string& device, const std::string& owner,
                                                            int64_t lease_until_ms, store::ClaimKind kind,
                                                            const store::MaxRunningJobs& max_running) {
  auto claimed = metadata_->ClaimJob(owner, lease_until_ms, [&](v1::Job& job, std::vector<v1::JobEvent>& events) {
    const v1::JobState before = job.state();
    if (absl::Status s = StartOn(device, job); !s.ok()) return s;
    NoteStateChange(before, job, events);
    return absl::OkStatus();
  }, kind, max_running);
  if (claimed.ok() && claimed->has_value()) events_->Publish((*claimed)->id());
  return claimed;
}

absl::StatusOr<v1::JobState> JobRepository::Renew(const std::string& id, const std::string& owner,
                                                  int64_t lease_until_ms) {
  return metadata_->RenewLease(id, owner, lease_until_ms);
}

absl::StatusOr<int64_t> JobRepository::CountInStates(const std::vector<v1::JobState>& states) {
  return metadata_->CountJobsInStates(states);
}

absl::StatusOr<v1::Job> JobRepository::Cancel(const std::string& id, const std::string& reason) {
  return Transition(id, [&](v1::Job& job, std::vector<v1::JobEvent>&) {
    if (job.state() == v1::QUEUED) {
      job.set_state(v1::CANCELLED);
      *job.mutable_error() = ErrorOf(absl::CancelledError(absl::StrCat(reason, " while queued")));
    } else if (job.state() == v1::RUNNING) {
      job.set_state(v1::CANCELLING);
    }
    return absl::OkStatus();
  });
}

absl::Status JobRepository::Progress(const std::string& id, const v1::JobProgress& progress) {
  return Transition(id, [&](v1::Job& job, std::vector<v1::JobEvent>& events) {
           if (!Runs(job.state())) return NotIn(job, "make progress");
           *job.mutable_progress() = progress;
           v1::JobEvent event;
           *event.mutable_progress() = progress;
           events.push_back(std::move(event));
           return absl::OkStatus();
         })
      .status();
}

absl::StatusOr<v1::Job> JobRepository::Succeed(const std::string& id,
                                               const std::map<v1::Artifact, store::ResultRef>& results,
                                               const v1::RunReport& report, const std::string& owner) {
  return TransitionRetried(
      id,
      [&](v1::Job& job, std::vector<v1::JobEvent>& events) {
        if (!Runs(job.state())) return NotIn(job, "succeed");
        // A cancel that came as the last batch finished loses: the results exist and are whole.
        job.set_state(v1::SUCCEEDED);
        v1::JobEvent summary;
        *summary.mutable_summary() = report;
        events.push_back(std::move(summary));
        return absl::OkStatus();
      },
      results, owner);
}

absl::StatusOr<v1::Job> JobRepository::Fail(const std::string& id, const absl::Status& error,
                                            const std::string& owner) {
  return TransitionRetried(
      id,
      [&](v1::Job& job, std::vector<v1::JobEvent>& events) {
    if (!Runs(job.state())) return NotIn(job, "fail");
    if (job.state() == v1::CANCELLING) {
      job.set_state(v1::CANCELLED);
      *job.mutable_error() = ErrorOf(absl::CancelledError("cancelled by request"));
      return absl::OkStatus();
    }
    job.set_state(v1::FAILED);
    *job.mutable_error() = ErrorOf(error);
    v1::JobEvent failure;
    *failure.mutable_failure() = job.error();
    events.push_back(std::move(failure));
    return absl::OkStatus();
      },
      {}, owner);
}

absl::StatusOr<v1::Job> JobRepository::Cancelled(const std::string& id, const std::string& reason,
                                                 const std::string& owner) {
  return TransitionRetried(
      id,
      [&](v1::Job& job, std::vector<v1::JobEvent>&) {
        if (!Runs(job.state())) return NotIn(job, "be cancelled");
        job.set_state(v1::CANCELLED);
        *job.mutable_error() = ErrorOf(absl::CancelledError(reason));
        return absl::OkStatus();
      },
      {}, owner);
}

absl::StatusOr<v1::Job> JobRepository::Requeue(const std::string& id, const std::string& owner) {
  return TransitionRetried(
      id,
      [&](v1::Job& job, std::vector<v1::JobEvent>&) {
    if (!Runs(job.state())) return NotIn(job, "be queued again");
    if (job.state() == v1::CANCELLING) {
      job.set_state(v1::CANCELLED);
      *job.mutable_error() = ErrorOf(absl::CancelledError("cancelled by request"));
      return absl::OkStatus();
    }
    job.set_state(v1::QUEUED);
    job.clear_progress();
    return absl::OkStatus();
      },
      {}, owner);
}

absl::StatusOr<std::vector<v1::Job>> JobRepository::RecoverInterrupted(int max_attempts) {
  auto running = metadata_->JobsInStates({v1::RUNNING, v1::CANCELLING});
  if (!running.ok()) return running.status();
  std::vector<store::StoredJob> interrupted;
  for (const v1::Job& job : *running) {
    auto stored = metadata_->ReadJob(job.id());
    if (!stored.ok()) return stored.status();
    interrupted.push_back(*std::move(stored));
  }
  return Recover(interrupted, max_attempts, /*fail_client_streams=*/false);
}

absl::StatusOr<std::vector<v1::Job>> JobRepository::RecoverExpired(int64_t now_ms, int max_attempts) {
  auto expired = metadata_->JobsWithExpiredLeases(now_ms);
  if (!expired.ok()) return expired.status();
  return Recover(*expired, max_attempts, /*fail_client_streams=*/true);
}

absl::StatusOr<std::vector<v1::Job>> JobRepository::Recover(const std::vector<store::StoredJob>& interrupted,
                                                            int max_attempts, bool fail_client_streams) {
  std::vector<v1::Job> changed;
  for (const store::StoredJob& found : interrupted) {
    // Only as found: a worker that renewed its lease meanwhile, or another process that
    // recovered the job first, wins (ABORTED: left alone).
    auto job = Transition(
        found.job.id(),
        [&](v1::Job& job, std::vector<v1::JobEvent>& events) {
          if (!Runs(job.state())) return absl::OkStatus();
          job.clear_progress();
          if (job.state() == v1::CANCELLING) {
            job.set_state(v1::CANCELLED);
            *job.mutable_error() = ErrorOf(absl::CancelledError("cancelled"));
          } else if (fail_client_streams && job.spec().data().has_client_stream() && !store::IsCoordinated(job)) {
            job.set_state(v1::FAILED);
            *job.mutable_error() = ErrorOf(absl::AbortedError(absl::StrCat(
                "the worker running this client-stream job stopped renewing its lease (it died or lost the "
                "store) after ",
                job.attempts(), job.attempts() == 1 ? " attempt" : " attempts",
                "; the batches pushed to it are not kept, so it cannot run again: submit the job again and "
                "push from the first batch")));
            v1::JobEvent failure;
            *failure.mutable_failure() = job.error();
            events.push_back(std::move(failure));
          } else if (job.attempts() >= max_attempts) {
            // A job that keeps taking its worker down must not do so forever.
            job.set_state(v1::FAILED);
            *job.mutable_error() = ErrorOf(absl::AbortedError(
                absl::StrCat("the worker running this job stopped, ", job.attempts(), " times (--max_attempts=",
                             max_attempts, "); it is not run again")));
          } else {
            job.set_state(v1::QUEUED);
          }
          return absl::OkStatus();
        },
        {}, "", found.version);
    if (absl::IsAborted(job.status())) continue;
    if (!job.ok()) return job.status();
    changed.push_back(*std::move(job));
  }
  return changed;
}

}  // namespace recal::jobs
