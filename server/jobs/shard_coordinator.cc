#include "server/jobs/shard_coordinator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/now.h"
#include "common/status_macros.h"
#include "server/jobs/job_finished.h"
#include "server/log/log.h"

namespace recal::jobs {
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

ShardCoordinator::ShardCoordinator(const TaskSources& sources, JobRunner* runner, StreamFeeds* feeds,
                                   WakeSignal* wake, const SchedulerOptions& options,
                                   std::function<void(const std::string&)> stop_here)
    : sources_(sources),
      runner_(runner),
      feeds_(feeds),
      wake_(wake),
      options_(options),
      stop_here_(std::move(stop_here)) {}

absl::StatusOr<JobOutputs> ShardCoordinator::Coordinate(const v1::Job& job, RunFlags& flags) {
  const absl::Time deadline = absl::Now() + absl::Seconds(options_.TimeoutFor(job.spec()));
  RECAL_ASSIGN_OR_RETURN(const std::vector<v1::Job> shards, AwaitShards(job, flags, deadline));
  return Merge(job, shards, flags, deadline);
}

absl::StatusOr<std::vector<v1::Job>> ShardCoordinator::AwaitShards(const v1::Job& job, const RunFlags& flags,
                                                                   absl::Time deadline) {
  std::vector<v1::Job> shards;
  v1::JobProgress published;
  while (true) {
    const int64_t seen = wake_->Count();
    if (flags.cancel) {
      if (flags.by_user) CancelShards(shards, "the sharded job was cancelled");
      return absl::CancelledError("cancelled");
    }
    if (absl::Now() > deadline) {
      CancelShards(shards, "the sharded job ran past its timeout");
      return absl::DeadlineExceededError(
          absl::StrCat("the job ran past its timeout of ", options_.TimeoutFor(job.spec()), " s"));
    }
    // A store that does not answer is waited out: the lease keeper decides when to give up.
    if (auto read = sources_.jobs->Children(job.id()); read.ok()) {
      shards = *std::move(read);
      RECAL_ASSIGN_OR_RETURN(const bool all_succeeded, AllSucceeded(job, shards, published));
      if (all_succeeded) return shards;
    }
    wake_->WaitAfter(seen, std::min(options_.poll_interval, absl::Milliseconds(250)), flags.cancel);
  }
}

absl::StatusOr<bool> ShardCoordinator::AllSucceeded(const v1::Job& job, const std::vector<v1::Job>& shards,
                                                    v1::JobProgress& published) {
  const v1::JobSpec& spec = job.spec();
  if (static_cast<int>(shards.size()) != spec.shards()) {
    return absl::InternalError(
        absl::StrCat("job ", job.id(), " has ", shards.size(), " shards stored, not ", spec.shards()));
  }
  const v1::JobProgress progress = SumOfShards(shards);
  if (progress.SerializeAsString() != published.SerializeAsString()) {
    sources_.jobs->Progress(job.id(), progress).IgnoreError();  // advice, as for a job's own progress
    published = progress;
  }
  int succeeded = 0;
  for (const v1::Job& shard : shards) {
    if (shard.state() == v1::SUCCEEDED) ++succeeded;
    if (shard.state() == v1::FAILED || shard.state() == v1::CANCELLED) {
      CancelShards(shards, absl::StrCat("shard ", shard.shard(), " of the job ended ", v1::JobState_Name(shard.state())));
      const absl::StatusCode code = shard.state() == v1::CANCELLED ? absl::StatusCode::kCancelled
                                                                   : static_cast<absl::StatusCode>(shard.error().code());
      return absl::Status(code, absl::StrCat("shard ", shard.shard(), " (", shard.id(), ") ",
                                             v1::JobState_Name(shard.state()), ": ", shard.error().message()));
    }
  }
  return succeeded == spec.shards();
}

absl::StatusOr<JobOutputs> ShardCoordinator::Merge(const v1::Job& job, const std::vector<v1::Job>& shards,
                                                   RunFlags& flags, absl::Time deadline) {
  RECAL_ASSIGN_OR_RETURN(const std::unique_ptr<Scratch> scratch, Scratch::Make(*sources_.blobs, job));
  RECAL_ASSIGN_OR_RETURN(const RecalibrationTask task,
                         BuildTask(sources_, job, TaskPurpose::Merge(shards), scratch->path(), flags.cancel));
  RunHooks hooks;
  hooks.cancel = &flags.cancel;
  hooks.deadline = deadline;
  JobOutputs outputs;
  RECAL_ASSIGN_OR_RETURN(outputs.report, runner_->Recalibrate(task, hooks));
  outputs.report.set_seconds(SecondsBetween(job.start_time(), NowTimestamp()));
  // The merge ran on the CPU; the statistics come from where the shards ran.
  outputs.report.set_device(ShardDevices(shards));
  const ScratchFiles files = JobFiles(job.spec());
  RECAL_RETURN_IF_ERROR(sources_.models->stored_bytes().ReserveResultsWhileHeld(job, scratch->path(), files, flags));
  RECAL_ASSIGN_OR_RETURN(outputs.results, AdoptResults(*sources_.blobs, scratch->path(), files));
  return outputs;
}

void ShardCoordinator::CancelShards(const std::vector<v1::Job>& shards, const std::string& reason) {
  for (const v1::Job& shard : shards) {
    if (IsTerminal(shard.state())) continue;
    auto cancelled = sources_.jobs->Cancel(shard.id(), reason);
    if (!cancelled.ok()) {
      log::Warning("shard not cancelled", {{"job_id", shard.id()}, {"error", std::string(cancelled.status().message())}});
      continue;
    }
    stop_here_(shard.id());  // if it runs in this process; elsewhere its worker sees CANCELLING
    feeds_->Close(shard.id(), absl::CancelledError(reason));
    if (IsTerminal(cancelled->state())) JobFinished(*cancelled, options_.metrics);
  }
}

}  // namespace recal::jobs
