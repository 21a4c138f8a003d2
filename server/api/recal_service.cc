#include "server/api/recal_service.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "server/metrics/metrics.h"

namespace recal::api {
namespace {

// Returns from the adapter with the gRPC form of a non-OK status (common/status_macros.h has
// the absl::Status twin).
#define RECAL_GRPC_RETURN_IF_ERROR(expr)                               \
  do {                                                            \
    const absl::Status _status = (expr);                          \
    if (!_status.ok()) return ::recal::ToGrpcStatus(_status);     \
  } while (0)

template <typename T>
grpc::Status Respond(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status RecalService::UploadModel(grpc::ServerContext* context,
                                       grpc::ServerReader<v1::UploadModelRequest>* reader,
                                       v1::Model* response) {
  v1::UploadModelRequest message;
  if (!reader->Read(&message) || !message.has_header()) {
    return ToGrpcStatus(absl::InvalidArgumentError("the first message of an upload is its header"));
  }
  const v1::UploadHeader header = message.header();
  auto existing = models_->StartUpload(header);
  if (!existing.ok()) return ToGrpcStatus(existing.status());
  if (existing->has_value()) {
    *response = **existing;  // the same bytes are stored already
    return grpc::Status::OK;
  }
  while (reader->Read(&message)) {
    if (!message.has_chunk()) {
      return ToGrpcStatus(absl::InvalidArgumentError("only chunks may follow the upload header"));
    }
    RECAL_GRPC_RETURN_IF_ERROR(models_->AppendChunk(header, message.chunk()));
    if (metrics_) metrics_->upload_bytes.Increment(static_cast<double>(message.chunk().data().size()));
  }
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "upload broken off");
  return Respond(models_->FinishUpload(header), response);
}

grpc::Status RecalService::GetUploadStatus(grpc::ServerContext*, const v1::GetUploadStatusRequest* request,
                                           v1::UploadStatus* response) {
  return Respond(models_->UploadStatus(request->sha256()), response);
}

grpc::Status RecalService::GetModel(grpc::ServerContext*, const v1::GetModelRequest* request,
                                    v1::Model* response) {
  return Respond(models_->Get(request->id()), response);
}

grpc::Status RecalService::ListModels(grpc::ServerContext*, const v1::ListModelsRequest* request,
                                      v1::ListModelsResponse* response) {
  auto page = models_->List(request->page_size(), request->page_token());
  if (!page.ok()) return ToGrpcStatus(page.status());
  for (v1::Model& model : page->models) *response->add_models() = std::move(model);
  response->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

grpc::Status RecalService::DeleteModel(grpc::ServerContext*, const v1::DeleteModelRequest* request,
                                       v1::DeleteModelResponse*) {
  return ToGrpcStatus(models_->Delete(request->id()));
}

grpc::Status RecalService::SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                                     v1::Job* response) {
  return Respond(jobs_->Submit(*request), response);
}

grpc::Status RecalService::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request, v1::Job* response) {
  return Respond(jobs_->Get(request->id()), response);
}

grpc::Status RecalService::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                                    v1::ListJobsResponse* response) {
  std::vector<v1::JobState> states;
  for (int state : request->states()) states.push_back(static_cast<v1::JobState>(state));
  auto page = jobs_->List(states, request->page_size(), request->page_token());
  if (!page.ok()) return ToGrpcStatus(page.status());
  for (v1::Job& job : page->jobs) *response->add_jobs() = std::move(job);
  response->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

grpc::Status RecalService::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                                     v1::Job* response) {
  return Respond(jobs_->Cancel(request->id()), response);
}

grpc::Status RecalService::WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                                    grpc::ServerWriter<v1::JobEvent>* writer) {
  struct Open {
    metrics::Metrics* metrics;
    explicit Open(metrics::Metrics* m) : metrics(m) {
      if (metrics) metrics->watch_streams.Increment();
    }
    ~Open() {
      if (metrics) metrics->watch_streams.Decrement();
    }
  } open(metrics_);
  return ToGrpcStatus(jobs_->Watch(
      request->id(), request->after_seq(),
      [&](const v1::JobEvent& event) { return writer->Write(event); },
      [&] { return context->IsCancelled(); }));
}

grpc::Status RecalService::PushBatches(grpc::ServerContext*, grpc::ServerReader<v1::PushBatchesRequest>* reader,
                                       v1::PushBatchesResponse* response) {
  v1::PushBatchesRequest message;
  std::string job_id;
  while (reader->Read(&message)) {
    if (job_id.empty()) job_id = message.job_id();
    if (job_id.empty()) return ToGrpcStatus(absl::InvalidArgumentError("the first message names the job"));
    RECAL_GRPC_RETURN_IF_ERROR(jobs_->PushBatch(job_id, message.inputs(), message.last()));
    if (!message.inputs().empty()) response->set_batches_received(response->batches_received() + 1);
  }
  return grpc::Status::OK;
}

grpc::Status RecalService::DownloadResult(grpc::ServerContext* context,
                                          const v1::DownloadResultRequest* request,
                                          grpc::ServerWriter<v1::DownloadResultChunk>* writer) {
  auto result = jobs_->OpenResult(request->job_id(), request->artifact());
  if (!result.ok()) return ToGrpcStatus(result.status());
  const store::ResultRef& ref = result->ref;
  if (request->offset() < 0 || request->offset() > ref.size) {
    return ToGrpcStatus(absl::OutOfRangeError(
        absl::StrCat("offset ", request->offset(), " is outside the artifact's ", ref.size, " bytes")));
  }
  int64_t offset = request->offset();
  bool first = true;
  do {
    v1::DownloadResultChunk chunk;
    chunk.set_offset(offset);
    if (absl::Status read = result->reader->ReadAt(offset, download_chunk_bytes_, chunk.mutable_data()); !read.ok()) {
      return ToGrpcStatus(read);
    }
    const int64_t got = static_cast<int64_t>(chunk.data().size());
    chunk.set_total_size(ref.size);
    if (first) chunk.set_sha256(ref.sha256);
    first = false;
    if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "download broken off");
    if (metrics_) metrics_->download_bytes.Increment(static_cast<double>(got));
    offset += got;
  } while (offset < ref.size && !context->IsCancelled());
  return grpc::Status::OK;
}

}  // namespace recal::api
