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
  if (spec.batch_size() == 0) spec.set_batch_size(kDefaultBatchSize);
  *spec.mutable_data() = source;

  // Local data is opened before anything is sent, so a bad file costs no job.
  std::unique_ptr<LocalBatches> batches;
  if (!local_spec.empty()) {
    RECAL_ASSIGN_OR_RETURN(batches, LocalBatches::Open(local_spec, spec.batch_size()));
  }

  RecalibrateResult result;
  const TransferCallback upload_progress = [&](int64_t done, int64_t total) {
    Progress p;
    p.phase = Progress::Phase::kUpload;
    p.done = done;
    p.total = total;
    Report(on_progress, p);
  };
  RECAL_ASSIGN_OR_RETURN(result.upload,
                         UploadModel(model_path, options.model_name, options.model_labels, upload_progress));
  if (result.upload.already_present) {
    Progress p;
    p.phase = Progress::Phase::kUpload;
    p.model_already_present = true;
    Report(on_progress, p);
  }
  spec.set_model_id(result.upload.model.id());
  RECAL_ASSIGN_OR_RETURN(const v1::Job submitted, Submit(spec));

  if (batches) {
    // The job takes at most max_batches; pushing more would only be refused.
    const int64_t max_batches = spec.options().max_batches();
    const int64_t total =
        max_batches > 0 ? std::min(max_batches, batches->num_batches()) : batches->num_batches();
    int64_t pushed = 0;
    // A sharded job takes one stream per shard, each its contiguous run of the batches;
    // they go one after the other (a shard's worker waits for its stream meanwhile).
    const int shards = std::max(1, spec.shards());
    for (int k = 0; k < shards; ++k) {
      const int64_t end = total * (k + 1) / shards;
      auto pushed_or = PushBatches(
          submitted.id(),
          [&](std::vector<v1::Tensor>* inputs) -> absl::StatusOr<bool> {
            if (pushed >= end) return false;
            RECAL_ASSIGN_OR_RETURN(bool more, batches->Next(inputs));
            if (!more) return false;
            ++pushed;
            Progress p;
            p.phase = Progress::Phase::kPush;
            p.done = pushed;
            p.total = total;
            Report(on_progress, p);
            return true;
          },
          k);
      // FAILED_PRECONDITION: the job takes no more data (it has what it needs, or it ended);
      // the watch below tells which. Anything else leaves a job waiting for data in vain.
      if (!pushed_or.ok() && pushed_or.status().code() != absl::StatusCode::kFailedPrecondition) {
        Cancel(submitted.id()).IgnoreError();
        return pushed_or.status();
      }
    }
  }

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
  RECAL_ASSIGN_OR_RETURN(result.job, Watch(submitted.id(), job_progress));
  if (result.job.state() != v1::SUCCEEDED) return client_internal::JobError(result.job);

  std::vector<std::pair<v1::Artifact, std::string>> wanted = {{v1::MODEL, out_path}};
  if (!options.bn_out.empty()) wanted.emplace_back(v1::BN_BUFFERS, options.bn_out);
  if (!options.report_out.empty()) wanted.emplace_back(v1::REPORT, options.report_out);
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
    RECAL_ASSIGN_OR_RETURN(DownloadResult downloaded,
                           Download(result.job.id(), which, path, download_progress));
    result.downloads.push_back(std::move(downloaded));
  }
  return result;
}

}  // namespace recal
