#include "server/api/recal_service.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/request_limits.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "server/api/list_pages.h"
#include "server/api/request_bounds.h"
#include "server/api/watch_job_reactor.h"
#include "server/log/log.h"
#include "server/metrics/metrics.h"

namespace recal::api {
namespace {

// Admins reach every tenant's jobs; everyone else their own tenant's.
jobs::Caller CallerOf(const auth::Principal& principal) {
  return jobs::Caller{principal.tenant, principal.role == auth::Role::kAdmin};
}

// Which tenant a List call covers: the caller's own, or for an admin the one it names ("*":
// every tenant, as the empty filter below).
absl::Status TenantFilter(const auth::Principal& who, const std::string& requested, absl::string_view what,
                          std::string* tenant) {
  *tenant = who.tenant;
  if (requested.empty() || requested == who.tenant) return absl::OkStatus();
  RECAL_RETURN_IF_ERROR(auth::Authorize(who, auth::Role::kAdmin, absl::StrCat("list another tenant's ", what)));
  *tenant = requested == "*" ? "" : requested;
  return absl::OkStatus();
}

// The names a verified client certificate goes by: its subject, then its SANs.
std::vector<std::string> CertificateNames(const grpc::ServerContextBase& context) {
  std::vector<std::string> names;
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return names;
  for (const char* property : {"x509_subject", "x509_subject_alternative_name"}) {
    for (const grpc::string_ref& value : auth->FindPropertyValues(property)) {
      names.emplace_back(value.data(), value.size());
    }
  }
  return names;
}

// The audit line of a mutating call: who, what, on what, and how it ended.
void Audit(const auth::Principal& who, absl::string_view method, absl::string_view resource,
           const absl::Status& outcome) {
  log::Info("audit", {{"tenant", who.tenant},
                      {"identity", who.name},
                      {"method", std::string(method)},
                      {"resource", log::ClientValue(resource)},
                      {"outcome", outcome.ok() ? "OK" : log::ClientValue(absl::StrCat("refused: ", outcome.message()))}});
}

}  // namespace

absl::StatusOr<auth::Principal> RecalService::Admit(grpc::ServerContextBase* context, auth::Role role,
                                                    absl::string_view action, absl::string_view resource) const {
  std::optional<std::string> authorization;
  const auto& metadata = context->client_metadata();
  if (auto found = metadata.find("authorization"); found != metadata.end()) {
    // Held to its limit before it is hashed or looked up; too long is no credential.
    if (absl::Status bounded = CheckAuthorization({found->second.data(), found->second.size()}); !bounded.ok()) {
      const absl::Status refusal = absl::UnauthenticatedError(bounded.message());
      RefusedUnauthenticated(context, action, resource, refusal);
      return refusal;
    }
    authorization = std::string(found->second.data(), found->second.size());
  }
  auto principal = auth_->Authenticate(authorization, CertificateNames(*context));
  if (!principal.ok()) {
    RefusedUnauthenticated(context, action, resource, principal.status());
    return principal.status();
  }
  if (absl::Status allowed = auth::Authorize(*principal, role, action); !allowed.ok()) {
    log::Warning("audit", {{"tenant", principal->tenant},
                           {"identity", principal->name},
                           {"peer", context->peer()},
                           {"method", std::string(action)},
                           {"resource", log::ClientValue(resource)},
                           {"outcome", absl::StrCat("refused: ", allowed.message())}});
    return allowed;
  }
  return principal;
}

void RecalService::RefusedUnauthenticated(grpc::ServerContextBase* context, absl::string_view action,
                                          absl::string_view resource, const absl::Status& refusal) const {
  if (metrics_) metrics_->unauthenticated_requests.Increment();
  log::WarnLimited(unauthenticated_log_, log::PeerHost(context->peer()), "audit",
                   {{"tenant", ""},
                    {"identity", "unknown"},
                    {"peer", context->peer()},
                    {"method", std::string(action)},
                    {"resource", log::ClientValue(resource)},
                    {"outcome", log::ClientValue(absl::StrCat("refused: ", refusal.message()))}});
}

int64_t RecalService::ListPageBytes() const {
  return std::min(limits::kListPageBytes, limits_.max_message_bytes / 2);
}

template <typename Body>
grpc::Status RecalService::Serve(grpc::ServerContextBase* context, auth::Role role, absl::string_view method,
                                 absl::string_view resource, Body&& body) const {
  absl::StatusOr<auth::Principal> who = Admit(context, role, method, resource);
  if (!who.ok()) return ToGrpcStatus(who.status());
  return ToGrpcStatus(body(*who));
}

template <typename Response, typename Body>
grpc::Status RecalService::Serve(grpc::ServerContextBase* context, auth::Role role, absl::string_view method,
                                 absl::string_view resource, Response* response, Body&& body) const {
  return Serve(context, role, method, resource, [&](const auth::Principal& who) -> absl::Status {
    RECAL_ASSIGN_OR_RETURN(*response, body(who));
    return absl::OkStatus();
  });
}

template <typename Body>
grpc::Status RecalService::ServeAudited(grpc::ServerContextBase* context, auth::Role role, absl::string_view method,
                                        absl::string_view resource, Body&& body) const {
  return Serve(context, role, method, resource, [&](const auth::Principal& who) -> absl::Status {
    std::string audited(resource);
    absl::Status outcome = body(who, audited);
    Audit(who, method, audited, outcome);
    return outcome;
  });
}

grpc::Status RecalService::UploadModel(grpc::ServerContext* context,
                                       grpc::ServerReader<v1::UploadModelRequest>* reader,
                                       v1::Model* response) {
  // Admitted before reading a byte of the upload.
  return ServeAudited(context, auth::Role::kSubmit, "UploadModel", "",
                      [&](const auth::Principal& who, std::string& audited) -> absl::Status {
                        v1::UploadModelRequest message;
                        if (!reader->Read(&message) || !message.has_header()) {
                          return absl::InvalidArgumentError("the first message of an upload is its header");
                        }
                        const v1::UploadHeader header = message.header();
                        audited = absl::StrCat("sha256:", header.sha256());
                        RECAL_RETURN_IF_ERROR(CheckBounds(header));
                        return Upload(who, context, reader, header, response);
                      });
}

absl::Status RecalService::Upload(const auth::Principal& who, grpc::ServerContext* context,
                                  grpc::ServerReader<v1::UploadModelRequest>* reader, const v1::UploadHeader& header,
                                  v1::Model* response) {
  v1::UploadModelRequest message;
  RECAL_ASSIGN_OR_RETURN(std::optional<v1::Model> existing, models_->StartUpload(who.tenant, header));
  if (existing.has_value()) {
    *response = *std::move(existing);  // the same bytes are stored already
    return absl::OkStatus();
  }
  bool finished = false;
  absl::Cleanup left = [&] {
    if (!finished) models_->LeaveUpload(who.tenant, header);
  };
  while (reader->Read(&message)) {
    if (!message.has_chunk()) return absl::InvalidArgumentError("only chunks may follow the upload header");
    RECAL_RETURN_IF_ERROR(models_->AppendChunk(who.tenant, header, message.chunk()));
    if (metrics_) metrics_->UploadBytes(who.tenant).Increment(static_cast<double>(message.chunk().data().size()));
  }
  if (context->IsCancelled()) return absl::CancelledError("upload broken off");
  RECAL_ASSIGN_OR_RETURN(*response, models_->FinishUpload(who.tenant, header));
  finished = true;
  return absl::OkStatus();
}

grpc::Status RecalService::GetUploadStatus(grpc::ServerContext* context, const v1::GetUploadStatusRequest* request,
                                           v1::UploadStatus* response) {
  return Serve(context, auth::Role::kRead, "GetUploadStatus", request->sha256(), response,
               [&](const auth::Principal& who) -> absl::StatusOr<v1::UploadStatus> {
                 RECAL_RETURN_IF_ERROR(CheckBounds(*request));
                 return models_->UploadStatus(who.tenant, request->sha256());
               });
}

grpc::Status RecalService::GetModel(grpc::ServerContext* context, const v1::GetModelRequest* request,
                                    v1::Model* response) {
  return Serve(context, auth::Role::kRead, "GetModel", request->id(), response,
               [&](const auth::Principal& who) -> absl::StatusOr<v1::Model> {
                 RECAL_RETURN_IF_ERROR(CheckBounds(*request));
                 return models_->Resolve(who.tenant, request->id());
               });
}

grpc::Status RecalService::ListModels(grpc::ServerContext* context, const v1::ListModelsRequest* request,
                                      v1::ListModelsResponse* response) {
  return Serve(context, auth::Role::kRead, "ListModels", request->tenant(), [&](const auth::Principal& who) {
    RECAL_RETURN_IF_ERROR(CheckBounds(*request));
    std::string tenant;
    RECAL_RETURN_IF_ERROR(TenantFilter(who, request->tenant(), "models", &tenant));
    RECAL_ASSIGN_OR_RETURN(
        store::ModelPage page,
        PageWithin(
            request->page_size(), ListPageBytes(),
            [&](int size) { return models_->List(tenant, size, request->page_token(), request->name()); },
            [](const store::ModelPage& p) -> const std::vector<v1::Model>& { return p.models; }));
    for (v1::Model& model : page.models) *response->add_models() = std::move(model);
    response->set_next_page_token(page.next_page_token);
    return absl::OkStatus();
  });
}

grpc::Status RecalService::DeleteModel(grpc::ServerContext* context, const v1::DeleteModelRequest* request,
                                       v1::DeleteModelResponse* response) {
  return ServeAudited(context, auth::Role::kAdmin, "DeleteModel", request->id(),
                      [&](const auth::Principal& who, std::string& audited) -> absl::Status {
                        RECAL_RETURN_IF_ERROR(CheckBounds(*request));
                        const std::string tenant = request->tenant().empty() ? who.tenant : request->tenant();
                        // The reference as given, and the exact bytes it named.
                        audited = absl::StrCat(tenant, "/", request->id());
                        RECAL_ASSIGN_OR_RETURN(*response->mutable_model(), models_->Delete(tenant, request->id()));
                        absl::StrAppend(&audited, " = ", response->model().id());
                        return absl::OkStatus();
                      });
}

grpc::Status RecalService::SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                                     v1::Job* response) {
  return ServeAudited(context, auth::Role::kSubmit, "SubmitJob", request->spec().model_id(),
                      [&](const auth::Principal& who, std::string& audited) -> absl::Status {
                        RECAL_RETURN_IF_ERROR(CheckBounds(*request));
                        RECAL_RETURN_IF_ERROR(CheckPriority(who.role, request->spec().priority()));
                        RECAL_ASSIGN_OR_RETURN(*response, jobs_->Submit(CallerOf(who), *request));
                        audited = response->id();
                        return absl::OkStatus();
                      });
}

grpc::Status RecalService::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request, v1::Job* response) {
  return Serve(context, auth::Role::kRead, "GetJob", request->id(), response,
               [&](const auth::Principal& who) -> absl::StatusOr<v1::Job> {
                 RECAL_RETURN_IF_ERROR(CheckBounds(*request));
                 return jobs_->Get(CallerOf(who), request->id());
               });
}

grpc::Status RecalService::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                                    v1::ListJobsResponse* response) {
  return Serve(context, auth::Role::kRead, "ListJobs", request->tenant(), [&](const auth::Principal& who) {
    RECAL_RETURN_IF_ERROR(CheckBounds(*request));
    std::string tenant;
    std::vector<v1::JobState> states;
    for (int state : request->states()) states.push_back(static_cast<v1::JobState>(state));
    RECAL_RETURN_IF_ERROR(TenantFilter(who, request->tenant(), "jobs", &tenant));
    RECAL_ASSIGN_OR_RETURN(
        store::JobPage page,
        PageWithin(
            request->page_size(), ListPageBytes(),
            [&](int size) { return jobs_->List(tenant, states, size, request->page_token()); },
            [](const store::JobPage& p) -> const std::vector<v1::Job>& { return p.jobs; }));
    for (v1::Job& job : page.jobs) *response->add_jobs() = std::move(job);
    response->set_next_page_token(page.next_page_token);
    return absl::OkStatus();
  });
}

grpc::Status RecalService::CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                                     v1::Job* response) {
  return ServeAudited(context, auth::Role::kSubmit, "CancelJob", request->id(),
                      [&](const auth::Principal& who, std::string& /*audited*/) -> absl::Status {
                        RECAL_RETURN_IF_ERROR(CheckBounds(*request));
                        RECAL_ASSIGN_OR_RETURN(*response, jobs_->Cancel(CallerOf(who), request->id()));
                        return absl::OkStatus();
                      });
}

grpc::Status RecalService::DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                                     v1::DeleteJobResponse* response) {
  return ServeAudited(context, auth::Role::kAdmin, "DeleteJob", request->id(),
                      [&](const auth::Principal& who, std::string& audited) -> absl::Status {
                        RECAL_RETURN_IF_ERROR(CheckBounds(*request));
                        // As DeleteModel: the caller's tenant, or the one an admin names; never
                        // every tenant, so another tenant's job id is NOT_FOUND as a missing one.
                        const std::string tenant = request->tenant().empty() ? who.tenant : request->tenant();
                        audited = absl::StrCat(tenant, "/", request->id());
                        RECAL_ASSIGN_OR_RETURN(jobs::JobManager::Deleted deleted,
                                               jobs_->Delete(jobs::Caller{tenant}, request->id()));
                        *response->mutable_job() = std::move(deleted.job);
                        response->set_result_bytes(deleted.result_bytes);
                        return absl::OkStatus();
                      });
}

grpc::Status RecalService::GetUsage(grpc::ServerContext* context, const v1::GetUsageRequest* request,
                                    v1::Usage* response) {
  return Serve(context, auth::Role::kRead, "GetUsage", request->tenant(), response,
               [&](const auth::Principal& who) -> absl::StatusOr<v1::Usage> {
                 RECAL_RETURN_IF_ERROR(CheckBounds(*request));
                 if (!request->tenant().empty() && request->tenant() != who.tenant) {
                   RECAL_RETURN_IF_ERROR(auth::Authorize(who, auth::Role::kAdmin, "see another tenant's usage"));
                 }
                 return models_->Usage(request->tenant().empty() ? who.tenant : request->tenant());
               });
}

grpc::ServerWriteReactor<v1::JobEvent>* RecalService::WatchJob(grpc::CallbackServerContext* context,
                                                               const v1::WatchJobRequest* request) {
  auto who = Admit(context, auth::Role::kRead, "WatchJob", request->id());
  if (!who.ok()) return WatchJobReactor::Refuse(ToGrpcStatus(who.status()));
  if (absl::Status bounded = CheckBounds(*request); !bounded.ok()) {
    return WatchJobReactor::Refuse(ToGrpcStatus(bounded));
  }
  return new WatchJobReactor(jobs_, &watch_reads_, CallerOf(*who), request->id(), request->after_seq(), metrics_);
}

grpc::Status RecalService::PushBatches(grpc::ServerContext* context,
                                       grpc::ServerReader<v1::PushBatchesRequest>* reader,
                                       v1::PushBatchesResponse* response) {
  return ServeAudited(context, auth::Role::kSubmit, "PushBatches", "",
                      [&](const auth::Principal& who, std::string& audited) -> absl::Status {
                        std::string job_id;
                        absl::Status outcome = PushAll(who, context, reader, response, &job_id);
                        audited = absl::StrCat(job_id, " (", response->batches_received(), " batches)");
                        return outcome;
                      });
}

absl::Status RecalService::PushAll(const auth::Principal& who, grpc::ServerContext* context,
                                   grpc::ServerReader<v1::PushBatchesRequest>* reader,
                                   v1::PushBatchesResponse* response, std::string* job_id) {
  v1::PushBatchesRequest message;
  // Opened at the first message, which names the job: into this process's feed, or relayed
  // to the worker process that runs the job (cluster mode).
  std::unique_ptr<jobs::PushStream> stream;
  absl::Status outcome;
  while (outcome.ok() && reader->Read(&message)) {
    if (outcome = CheckBounds(message); !outcome.ok()) break;
    if (!stream) {
      *job_id = message.job_id();
      if (job_id->empty()) {
        outcome = absl::InvalidArgumentError("the first message names the job");
        break;
      }
      auto opened = jobs_->OpenPush(CallerOf(who), *job_id, message.shard(), [context] { return context->IsCancelled(); });
      if (!opened.ok()) {
        outcome = opened.status();
        break;
      }
      stream = *std::move(opened);
    }
    // The parts of a batch sent in parts count once, at the part that completes it.
    const bool batch = !message.inputs().empty() && !message.batch_continues();
    outcome = stream->Push(message);
    if (outcome.ok() && batch) response->set_batches_received(response->batches_received() + 1);
  }
  if (stream) {
    const absl::Status finished = stream->Finish();
    if (outcome.ok()) outcome = finished;
  }
  return outcome;
}

grpc::Status RecalService::DownloadResult(grpc::ServerContext* context,
                                          const v1::DownloadResultRequest* request,
                                          grpc::ServerWriter<v1::DownloadResultChunk>* writer) {
  return Serve(context, auth::Role::kRead, "DownloadResult", request->job_id(), [&](const auth::Principal& who) {
    RECAL_RETURN_IF_ERROR(CheckBounds(*request));
    RECAL_ASSIGN_OR_RETURN(jobs::JobManager::OpenedResult result,
                           jobs_->OpenResult(CallerOf(who), request->job_id(), request->artifact()));
    return Download(who, context, *request, result, writer);
  });
}

absl::Status RecalService::Download(const auth::Principal& who, grpc::ServerContext* context,
                                    const v1::DownloadResultRequest& request,
                                    const jobs::JobManager::OpenedResult& result,
                                    grpc::ServerWriter<v1::DownloadResultChunk>* writer) {
  const store::ResultRef& ref = result.ref;
  if (request.offset() < 0 || request.offset() > ref.size) {
    return absl::OutOfRangeError(
        absl::StrCat("offset ", request.offset(), " is outside the artifact's ", ref.size, " bytes"));
  }
  int64_t offset = request.offset();
  bool first = true;
  do {
    v1::DownloadResultChunk chunk;
    chunk.set_offset(offset);
    RECAL_RETURN_IF_ERROR(result.reader->ReadAt(offset, limits_.download_chunk_bytes, chunk.mutable_data()));
    const int64_t got = static_cast<int64_t>(chunk.data().size());
    chunk.set_total_size(ref.size);
    if (first) chunk.set_sha256(ref.sha256);
    first = false;
    if (!writer->Write(chunk)) return absl::CancelledError("download broken off");
    if (metrics_) metrics_->DownloadBytes(who.tenant).Increment(static_cast<double>(got));
    offset += got;
  } while (offset < ref.size && !context->IsCancelled());
  return absl::OkStatus();
}

grpc::Status RecalService::GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                                         v1::ServerInfo* response) {
  return Serve(context, auth::Role::kRead, "GetServerInfo", "", [&](const auth::Principal& /*who*/) {
    response->set_version(Version());
    response->set_libtorch_version(LibTorchVersion());
    response->set_max_message_bytes(limits_.max_message_bytes);
    response->set_max_batch_bytes(jobs_->max_batch_bytes());
    return absl::OkStatus();
  });
}

}  // namespace recal::api
