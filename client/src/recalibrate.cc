// Recalibrate: upload, submit, (push,) watch, download, in one call.
#include <algorithm>
#include <utility>

#include "client/src/client_impl.h"
#include "common/status_macros.h"
#include "recal/data.h"

namespace recal {
namespace {

constexpr int64_t kDefaultBatchSize = 32;

void Report(const ProgressCallback& on_progress, Progress progress) {
  if (on_progress) on_progress(progress);
}

// The model, uploaded or found on the server, its bytes reported as they go.
absl::StatusOr<UploadResult> UploadReporting(Client& client, const std::string& model_path,
                                             const RecalibrateOptions& options, const ProgressCallback& on_progress) {
  const TransferCallback upload_progress = [&](int64_t done, int64_t total) {
    Progress p;
    p.phase = Progress::Phase::kUpload;
    p.done = done;
    p.total = total;
    Report(on_progress, p);
  };
  RECAL_ASSIGN_OR_RETURN(UploadResult upload,
                         client.UploadModel(model_path, options.model_name, options.model_labels, upload_progress));
  if (upload.already_present) {
    Progress p;
    p.phase = Progress::Phase::kUpload;
    p.model_already_present = true;
    Report(on_progress, p);
  }
  return upload;
}

// `batches` into the submitted job: one stream per shard, each its contiguous run of the
// batches, one after the other (a shard's worker waits for its stream meanwhile). The job
// takes at most max_batches: pushing more would only be refused. A push that fails for
// another reason than the job taking no more data cancels the job, which would otherwise
// wait for data in vain.
absl::Status PushLocalBatches(Client& client, const std::string& job_id, const v1::JobSpec& spec,
                              LocalBatches& batches, const ProgressCallback& on_progress) {
  const int64_t max_batches = spec.options().max_batches();
  const int64_t total = max_batches > 0 ? std::min(max_batches, batches.num_batches()) : batches.num_batches();
  int64_t pushed = 0;
  const int shards = std::max(1, spec.shards());
  for (int k = 0; k < shards; ++k) {
    const int64_t end = total * (k + 1) / shards;
    const BatchProducer next = [&](std::vector<v1::Tensor>* inputs) -> absl::StatusOr<bool> {
      if (pushed >= end) return false;
      RECAL_ASSIGN_OR_RETURN(bool more, batches.Next(inputs));
      if (!more) return false;
      ++pushed;
      Progress p;
      p.phase = Progress::Phase::kPush;
      p.done = pushed;
      p.total = total;
      Report(on_progress, p);
      return true;
    };
    absl::StatusOr<int64_t> pushed_or = client.PushBatches(job_id, next, k);
    // FAILED_PRECONDITION: the job takes no more data (it has what it needs, or it ended);
    // the watch after the pushes tells which.
    if (!pushed_or.ok() && !absl::IsFailedPrecondition(pushed_or.status())) {
      client.Cancel(job_id).IgnoreError();
      return pushed_or.status();
    }
  }
  return absl::OkStatus();
}

// The job watched to its end, each event reported with the batches it says are done.
absl::StatusOr<v1::Job> WatchReporting(Client& client, const std::string& job_id,
                                       const ProgressCallback& on_progress) {
  const EventCallback job_progress = [&](const v1::JobEvent& event) {
    Progress p;
    p.phase = Progress::Phase::kJob;
    p.event = &event;
    const v1::JobProgress* progress = event.has_progress()   ? &event.progress()
                                      : event.has_snapshot() ? &event.snapshot().progress()
                                                             : nullptr;
    if (progress != nullptr) {
      p.done = progress->batches_done();
      p.total = progress->batches_total();
    }
    Report(on_progress, p);
  };
  return client.Watch(job_id, job_progress);
}

// The recalibrated model to `out_path`, then the BatchNorm buffers and the report where asked.
absl::StatusOr<std::vector<DownloadResult>> DownloadResults(Client& client, const std::string& job_id,
                                                            const RecalibrateOptions& options,
                                                            const std::string& out_path,
                                                            const ProgressCallback& on_progress) {
  std::vector<std::pair<v1::Artifact, std::string>> wanted = {{v1::MODEL, out_path}};
  if (!options.bn_out.empty()) wanted.emplace_back(v1::BN_BUFFERS, options.bn_out);
  if (!options.folded_out.empty()) wanted.emplace_back(v1::FOLDED, options.folded_out);
  if (!options.report_out.empty()) wanted.emplace_back(v1::REPORT, options.report_out);
  std::vector<DownloadResult> downloads;
  for (const auto& [artifact, path] : wanted) {
    const v1::Artifact which = artifact;
    const TransferCallback download_progress = [&](int64_t done, int64_t total) {
      Progress p;
      p.phase = Progress::Phase::kDownload;
      p.artifact = which;
      p.done = done;
      p.total = total;
      Report(on_progress, p);
    };
    RECAL_ASSIGN_OR_RETURN(DownloadResult downloaded, client.Download(job_id, which, path, download_progress));
    downloads.push_back(std::move(downloaded));
  }
  return downloads;
}

}  // namespace

absl::StatusOr<RecalibrateResult> Client::Recalibrate(const std::string& model_path, absl::string_view data,
                                                      const RecalibrateOptions& options,
                                                      const std::string& out_path,
                                                      const ProgressCallback& on_progress) {
  if (options.stream) {
    RECAL_ASSIGN_OR_RETURN(v1::DataSource source, StreamSourceFromSpec(data, options.stream_normalisation));
    return Run(model_path, source, std::string(data), options, out_path, on_progress);
  }
  RECAL_ASSIGN_OR_RETURN(v1::DataSource source, DataSourceFromSpec(data));
  return Run(model_path, source, "", options, out_path, on_progress);
}

absl::StatusOr<RecalibrateResult> Client::Recalibrate(const std::string& model_path,
                                                      const v1::DataSource& data,
                                                      const RecalibrateOptions& options,
                                                      const std::string& out_path,
                                                      const ProgressCallback& on_progress) {
  if (data.has_client_stream()) {
    return absl::InvalidArgumentError(
        "a client_stream source needs local data: pass its spec with RecalibrateOptions::stream");
  }
  return Run(model_path, data, "", options, out_path, on_progress);
}

absl::StatusOr<RecalibrateResult> Client::Run(const std::string& model_path, const v1::DataSource& source,
                                              const std::string& local_spec,
                                              const RecalibrateOptions& options, const std::string& out_path,
                                              const ProgressCallback& on_progress) {
  if (out_path.empty()) return absl::InvalidArgumentError("no output path for the recalibrated model");
  v1::JobSpec spec = options.job;
  // A folded model to download is one the job must make.
  if (!options.folded_out.empty()) spec.mutable_options()->set_fold_batch_norm(true);
  if (spec.batch_size() == 0) spec.set_batch_size(kDefaultBatchSize);
  *spec.mutable_data() = source;

  // Local data is opened before anything is sent, so a bad file costs no job.
  std::unique_ptr<LocalBatches> batches;
  if (!local_spec.empty()) {
    RECAL_ASSIGN_OR_RETURN(batches, LocalBatches::Open(local_spec, spec.batch_size()));
  }

  RecalibrateResult result;
  if (options.stored_model.empty()) {
    RECAL_ASSIGN_OR_RETURN(result.upload, UploadReporting(*this, model_path, options, on_progress));
  } else {
    RECAL_ASSIGN_OR_RETURN(result.upload.model, GetModel(options.stored_model));
    result.upload.already_present = true;
    Progress p;
    p.phase = Progress::Phase::kUpload;
    p.model_already_present = true;
    Report(on_progress, p);
  }
  spec.set_model_id(result.upload.model.id());
  RECAL_ASSIGN_OR_RETURN(const v1::Job submitted, Submit(spec));
  if (batches) RECAL_RETURN_IF_ERROR(PushLocalBatches(*this, submitted.id(), spec, *batches, on_progress));
  RECAL_ASSIGN_OR_RETURN(result.job, WatchReporting(*this, submitted.id(), on_progress));
  if (result.job.state() != v1::SUCCEEDED) return client_internal::JobError(result.job);
  RECAL_ASSIGN_OR_RETURN(result.downloads, DownloadResults(*this, result.job.id(), options, out_path, on_progress));
  return result;
}

}  // namespace recal
