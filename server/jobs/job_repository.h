// The durable jobs and their state machine: every change of a job's state goes through
// here, is checked against the transitions below, is stored with its event in one
// transaction, and only then is announced on the event hub.
//
//   QUEUED ──Start──▶ RUNNING ──Succeed──▶ SUCCEEDED
//     │                 │  ├──Fail───────▶ FAILED
//     │             Cancel  └──Requeue────▶ QUEUED (shutdown; start-up recovery)
//     │                 ▼
//     │            CANCELLING ──(any end but Succeed and Requeue)──▶ CANCELLED
//     └──Cancel──▶ CANCELLED
//
// The scheduler, the API and recovery all go through the same calls, in one process or in
// many on one PostgreSQL store: every change is a compare-and-set on the job's stored
// version (retried on a concurrent change), and a run's end is written only by the worker
// that still holds the job's lease.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "recal/worker/v1/worker.pb.h"
#include "server/jobs/event_hub.h"
#include "server/store/metadata_store.h"

namespace recal::jobs {

bool IsTerminal(v1::JobState state);

// The id of shard `index` of the sharded job `parent_id`.
std::string ShardJobId(const std::string& parent_id, int index);

class JobRepository {
 public:
  JobRepository(store::MetadataStore* metadata, EventHub* events);

  // Stores `job` (its id, request_id and spec; state, times and counters are set here) as
  // QUEUED. A job with the same non-empty request_id is returned instead, `*created` false.
  // A sharded job (spec.shards > 1) is stored with its shards, QUEUED too, in one step.
  // Within the tenant's `quota`, counted by the store in that step (RESOURCE_EXHAUSTED over
  // it); its now_ms, if 0, is the job's create_time. `plan` (PlanJob's) is stored with the
  // job and with each shard.
  absl::StatusOr<v1::Job> Create(v1::Job job, const worker::v1::JobPlan& plan, bool* created,
                                 store::JobQuota quota = {});
  // The plan stored with job `id` (a shard's is its parent's); std::nullopt for a job stored
  // before plans were, which is planned again when it runs.
  absl::StatusOr<std::optional<worker::v1::JobPlan>> Plan(const std::string& id);
  // The shards of a sharded job, by index.
  absl::StatusOr<std::vector<v1::Job>> Children(const std::string& parent_id);
  absl::StatusOr<v1::Job> Get(const std::string& id);  // NOT_FOUND
  absl::StatusOr<v1::Job> FindByRequestId(const std::string& tenant, const std::string& request_id);  // NOT_FOUND
  // `tenant` empty: every tenant's.
  absl::StatusOr<store::JobPage> List(const std::string& tenant, const std::vector<v1::JobState>& states,
                                      int page_size, const std::string& page_token);
  absl::StatusOr<std::vector<v1::Job>> InStates(const std::vector<v1::JobState>& states);
  absl::StatusOr<std::vector<v1::JobEvent>> EventsAfter(const std::string& id, int64_t after_seq, int limit);
  absl::StatusOr<store::ResultRef> Result(const std::string& id, v1::Artifact artifact);
  // The job with its lease (who runs it).
  absl::StatusOr<store::StoredJob> Read(const std::string& id);
  // Where the worker process whose leases carry `owner` takes relayed pushes (NOT_FOUND:
  // none recorded), and the recording of it, by that process.
  absl::StatusOr<std::string> WorkerEndpoint(const std::string& owner);
  absl::Status RecordWorkerEndpoint(const std::string& owner, const std::string& address);

  // QUEUED → RUNNING on `device`, one attempt more. FAILED_PRECONDITION in any other state
  // (cancelled while it waited).
  absl::StatusOr<v1::Job> Start(const std::string& id, const std::string& device);
  // Start of the next job the store says is due (priority, fairness between tenants, age),
  // leased to `owner` until `lease_until_ms`, passing over the jobs of tenants that hold
  // `max_running` workers already (store::MetadataStore::ClaimJob). nullopt: nothing waits.
  absl::StatusOr<std::optional<v1::Job>> Claim(const std::string& device, const std::string& owner,
                                               int64_t lease_until_ms,
                                               store::ClaimKind kind = store::ClaimKind::kRun,
                                               const store::MaxRunningJobs& max_running = nullptr);
  // Keeps `owner`'s lease; returns the job's state (CANCELLING: stop it). FAILED_PRECONDITION
  // once the lease is gone (it expired and the job went back to the queue).
  absl::StatusOr<v1::JobState> Renew(const std::string& id, const std::string& owner, int64_t lease_until_ms);
  // QUEUED → CANCELLED, RUNNING → CANCELLING (the runner is stopped by the caller); a
  // CANCELLING or ended job is returned as it is.
  absl::StatusOr<v1::Job> Cancel(const std::string& id, const std::string& reason);
  // A running job's progress, kept on the job and appended as an event.
  absl::Status Progress(const std::string& id, const v1::JobProgress& progress);

  // The ends of a run (RUNNING or CANCELLING), each written whole or not at all, retried a
  // few times: an error returned means the store kept refusing and the job stays where it
  // was, for the next start to take up (bounded by max_attempts). With `owner` set, only
  // while `owner` holds the job's lease (FAILED_PRECONDITION otherwise).
  // SUCCEEDED with its results and the report as a summary event.
  absl::StatusOr<v1::Job> Succeed(const std::string& id, const std::map<v1::Artifact, store::ResultRef>& results,
                                  const v1::RunReport& report, const std::string& owner = "");
  // FAILED with `error` (a failure event first); CANCELLED instead if a cancel came first.
  absl::StatusOr<v1::Job> Fail(const std::string& id, const absl::Status& error, const std::string& owner = "");
  // CANCELLED (the runner stopped on request).
  absl::StatusOr<v1::Job> Cancelled(const std::string& id, const std::string& reason, const std::string& owner = "");
  // QUEUED again, progress cleared (the server stops: the job runs again from the start);
  // CANCELLED instead if a cancel came first.
  absl::StatusOr<v1::Job> Requeue(const std::string& id, const std::string& owner = "");

  // Jobs whose worker is gone are queued again, or FAILED once they have run `max_attempts`
  // times; CANCELLING ones end CANCELLED. RecoverInterrupted takes every running job (the
  // embedded server at start-up: no other process can be running them); RecoverExpired
  // those whose lease ended before `now_ms` (any process, any time). Returns the jobs changed.
  // A client-stream job (or shard) whose lease expired is FAILED (ABORTED) instead of queued:
  // the batches pushed into the lost run are gone, and a new run would wait for pushes its
  // client may have finished long ago. (At start-up the embedded server queues it again: its
  // clients push again to the restarted server.)
  absl::StatusOr<std::vector<v1::Job>> RecoverInterrupted(int max_attempts);
  absl::StatusOr<std::vector<v1::Job>> RecoverExpired(int64_t now_ms, int max_attempts);
  absl::StatusOr<int64_t> CountInStates(const std::vector<v1::JobState>& states);

 private:
  // Reads the job, lets `change` edit it (an error leaves it unchanged), and stores it with
  // `events` (a state event for a new state is added) and `results` in one transaction.
  using Change = std::function<absl::Status(v1::Job&, std::vector<v1::JobEvent>&)>;
  // `owner` set: only while that worker holds the lease. `expected_version` >= 0: only if
  // the job is still at that version (no retry on a concurrent change).
  absl::StatusOr<v1::Job> Transition(const std::string& id, const Change& change,
                                     const std::map<v1::Artifact, store::ResultRef>& results = {},
                                     const std::string& owner = "", int64_t expected_version = -1);
  absl::StatusOr<v1::Job> TransitionRetried(const std::string& id, const Change& change,
                                            const std::map<v1::Artifact, store::ResultRef>& results = {},
                                            const std::string& owner = "");
  absl::StatusOr<std::vector<v1::Job>> Recover(const std::vector<store::StoredJob>& interrupted, int max_attempts,
                                               bool fail_client_streams);

  store::MetadataStore* metadata_;
  EventHub* events_;
  // Read-modify-write of one job is atomic in this process (the store's transaction makes
  // each write whole; this makes the read and the write one step).
  std::mutex mu_;
};

}  // namespace recal::jobs
