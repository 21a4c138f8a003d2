// The gRPC adapters: caller -> principal (auth::Authenticator) -> role check -> domain call
// (jobs::ModelRegistry, jobs::JobManager) in the principal's tenant -> status. Every request's
// fields are held to their limits (request_bounds.h) before the domain sees them; listings
// page by bytes too (list_pages.h). One audit line per mutating call and per refused call,
// client values clipped (log::ClientValue); unauthenticated calls' lines limited per peer.
// No logic of their own beyond streaming.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "common/task_pool.h"
#include "recal/v1/recal.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/model_registry.h"
#include "server/log/repeat_limiter.h"

namespace recal::metrics {
struct Metrics;
}

namespace recal::api {

// WatchJob is on gRPC's callback API (a waiting watcher holds no thread); the rest is
// synchronous.
class RecalService final : public v1::Recal::WithCallbackMethod_WatchJob<v1::Recal::Service> {
 public:
  struct Limits {
    int64_t download_chunk_bytes = 1 << 20;  // bytes per DownloadResult message
    int64_t max_message_bytes = 8 << 20;     // what the gRPC server accepts (GetServerInfo tells clients)
    // Audit lines of unauthenticated calls: the first `burst` per peer per `interval`, then
    // one line saying how many more were suppressed (all are counted in the metrics).
    int unauthenticated_log_burst = 5;
    absl::Duration unauthenticated_log_interval = absl::Minutes(1);
    // Threads that read the store for all watchers (WatchJob waits hold none).
    int watch_read_threads = 4;
  };
  // `metrics` may be null.
  RecalService(const auth::Authenticator* auth, jobs::ModelRegistry* models, jobs::JobManager* jobs, Limits limits,
               metrics::Metrics* metrics = nullptr)
      : auth_(auth),
        models_(models),
        jobs_(jobs),
        limits_(limits),
        metrics_(metrics),
        unauthenticated_log_(limits.unauthenticated_log_burst, limits.unauthenticated_log_interval),
        watch_reads_(limits.watch_read_threads) {}

  grpc::Status UploadModel(grpc::ServerContext* context,
                           grpc::ServerReader<v1::UploadModelRequest>* reader,
                           v1::Model* response) override;
  grpc::Status GetUploadStatus(grpc::ServerContext* context, const v1::GetUploadStatusRequest* request,
                               v1::UploadStatus* response) override;
  grpc::Status GetModel(grpc::ServerContext* context, const v1::GetModelRequest* request,
                        v1::Model* response) override;
  grpc::Status ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                          v1::ListModelsResponse* response) override;
  grpc::Status DeleteModel(grpc::ServerContext* context, const v1::DeleteModelRequest* request,
                           v1::DeleteModelResponse* response) override;
  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;
  grpc::Status GetUsage(grpc::ServerContext* context, const v1::GetUsageRequest* request,
                        v1::Usage* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                   const v1::WatchJobRequest* request) override;
  grpc::Status PushBatches(grpc::ServerContext* context,
                           grpc::ServerReader<v1::PushBatchesRequest>* reader,
                           v1::PushBatchesResponse* response) override;
  grpc::Status DownloadResult(grpc::ServerContext* context, const v1::DownloadResultRequest* request,
                              grpc::ServerWriter<v1::DownloadResultChunk>* writer) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;

 private:
  // The caller's principal if it may do `action` (which needs `role`); the refusal is logged.
  absl::StatusOr<auth::Principal> Admit(grpc::ServerContextBase* context, auth::Role role, absl::string_view action,
                                        absl::string_view resource) const;
  // The audit line of a call refused as UNAUTHENTICATED, limited per peer, and its count.
  void RefusedUnauthenticated(grpc::ServerContextBase* context, absl::string_view action, absl::string_view resource,
                              const absl::Status& refusal) const;
  // The byte budget of one ListJobs / ListModels response.
  int64_t ListPageBytes() const;

  // Serves one call of `method` on `resource`, which needs `role`: admits the caller (Admit's
  // refusal is the answer), runs `body` with its principal, and answers with the gRPC form of
  // the absl::Status it returns. With `response`, `body` returns absl::StatusOr<Response>,
  // whose value becomes the response.
  template <typename Body>
  grpc::Status Serve(grpc::ServerContextBase* context, auth::Role role, absl::string_view method,
                     absl::string_view resource, Body&& body) const;
  template <typename Response, typename Body>
  grpc::Status Serve(grpc::ServerContextBase* context, auth::Role role, absl::string_view method,
                     absl::string_view resource, Response* response, Body&& body) const;
  // Serve for a call that changes something: writes its audit line once `body` has run, naming
  // the resource as `body` leaves its second argument (`resource` unless it names it better).
  template <typename Body>
  grpc::Status ServeAudited(grpc::ServerContextBase* context, auth::Role role, absl::string_view method,
                            absl::string_view resource, Body&& body) const;

  absl::Status Upload(const auth::Principal& who, grpc::ServerContext* context,
                      grpc::ServerReader<v1::UploadModelRequest>* reader, const v1::UploadHeader& header,
                      v1::Model* response);
  // Pushes the stream's batches into the job its first message names (`*job_id`), counting
  // them in `response`, until the client is done or one is refused.
  absl::Status PushAll(const auth::Principal& who, grpc::ServerContext* context,
                       grpc::ServerReader<v1::PushBatchesRequest>* reader, v1::PushBatchesResponse* response,
                       std::string* job_id);
  // Writes the result from request.offset() on, in chunks, until it ends or the client goes.
  absl::Status Download(const auth::Principal& who, grpc::ServerContext* context,
                        const v1::DownloadResultRequest& request, const jobs::JobManager::OpenedResult& result,
                        grpc::ServerWriter<v1::DownloadResultChunk>* writer);

  const auth::Authenticator* auth_;
  jobs::ModelRegistry* models_;
  jobs::JobManager* jobs_;
  const Limits limits_;
  metrics::Metrics* metrics_;
  mutable log::RepeatLimiter unauthenticated_log_;
  // Last: destroyed first, once gRPC has ended every watch (server shutdown waits for them).
  TaskPool watch_reads_;
};

}  // namespace recal::api
