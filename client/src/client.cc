// Connecting, and the unary calls: each a retried Impl::Unary.
#include "recal/client.h"

#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_format.h"
#include "client/src/channel_security.h"
#include "client/src/client_impl.h"
#include "common/status_macros.h"

namespace recal {
namespace {

// Where a failed job rides on the status Recalibrate returns.
constexpr char kJobPayloadUrl[] = "type.googleapis.com/recal.v1.Job";
// Marks the UNAVAILABLE of a target where no server answered (IsUnreachable).
constexpr char kUnreachablePayloadUrl[] = "recal.client/unreachable";

int Millis(absl::Duration d) { return static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(d))); }

}  // namespace

std::optional<v1::Job> JobOfError(const absl::Status& status) {
  auto payload = status.GetPayload(kJobPayloadUrl);  // absl::optional, not std:: in Debian's abseil
  if (!payload) return std::nullopt;
  v1::Job job;
  if (!job.ParseFromString(std::string(*payload))) return std::nullopt;
  return job;
}

bool IsUnreachable(const absl::Status& status) {
  return absl::IsUnavailable(status) && status.GetPayload(kUnreachablePayloadUrl).has_value();
}

namespace client_internal {

absl::Status UnreachableError(const std::string& target, absl::string_view detail) {
  absl::Status status = absl::UnavailableError(absl::StrCat("no recal-server answered at ", target, " (", detail, ")"));
  status.SetPayload(kUnreachablePayloadUrl, absl::Cord());
  return status;
}

absl::Status JobError(const v1::Job& job) {
  absl::StatusCode code = job.state() == v1::CANCELLED ? absl::StatusCode::kCancelled
                                                       : static_cast<absl::StatusCode>(job.error().code());
  if (code == absl::StatusCode::kOk) code = absl::StatusCode::kUnknown;
  absl::Status status(code, absl::StrCat("job ", job.id(), " ", v1::JobState_Name(job.state()),
                                         job.error().message().empty() ? "" : ": ", job.error().message()));
  status.SetPayload(kJobPayloadUrl, absl::Cord(job.SerializeAsString()));
  return status;
}

}  // namespace client_internal

Client::Client(std::string target, ClientOptions options, std::unique_ptr<Impl> impl)
    : target_(std::move(target)), options_(std::move(options)), impl_(std::move(impl)) {}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& target,
                                                        const ClientOptions& options) {
  if (target.empty()) return absl::InvalidArgumentError("no server address (HOST:PORT) given");
  if (options.chunk_bytes < 1) return absl::InvalidArgumentError("chunk_bytes must be positive");
  grpc::ChannelArguments args;
  auto credentials = client_internal::MakeChannelCredentials(options, &args);
  if (!credentials.ok()) return credentials.status();
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  // gRPC's own reconnection backoff (1 s growing to 120 s) would leave a restarted server
  // unnoticed for minutes; tie it to the retry policy instead.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, Millis(options.retry.initial_backoff));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, Millis(options.retry.initial_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, Millis(options.retry.max_backoff));

  auto impl = std::make_unique<Impl>();
  impl->target = target;
  impl->options = options;
  impl->channel = grpc::CreateCustomChannel(target, *credentials, args);
  impl->stub = v1::Recal::NewStub(impl->channel);
  impl->health = grpc::health::v1::Health::NewStub(impl->channel);
  return std::unique_ptr<Client>(new Client(target, options, std::move(impl)));
}

std::string Client::NewRequestId() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

absl::StatusOr<v1::UploadStatus> Client::GetUploadStatus(const std::string& sha256) {
  v1::GetUploadStatusRequest request;
  request.set_sha256(sha256);
  return impl_->Unary<v1::UploadStatus>([&](grpc::ClientContext* c, v1::UploadStatus* r) {
    return impl_->stub->GetUploadStatus(c, request, r);
  });
}

absl::StatusOr<v1::Model> Client::GetModel(const std::string& model_id) {
  v1::GetModelRequest request;
  request.set_id(model_id);
  return impl_->Unary<v1::Model>(
      [&](grpc::ClientContext* c, v1::Model* r) { return impl_->stub->GetModel(c, request, r); });
}

absl::StatusOr<v1::ListModelsResponse> Client::ListModels(int page_size, const std::string& page_token,
                                                          const std::string& name) {
  v1::ListModelsRequest request;
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  request.set_name(name);
  return impl_->Unary<v1::ListModelsResponse>([&](grpc::ClientContext* c, v1::ListModelsResponse* r) {
    return impl_->stub->ListModels(c, request, r);
  });
}

absl::StatusOr<v1::Model> Client::DeleteModel(const std::string& model) {
  v1::DeleteModelRequest request;
  request.set_id(model);
  // Not retried: a delete that went through before the connection broke would report
  // NOT_FOUND the second time, hiding that it worked.
  RECAL_ASSIGN_OR_RETURN(v1::DeleteModelResponse deleted,
                         impl_->Unary<v1::DeleteModelResponse>(
                             [&](grpc::ClientContext* c, v1::DeleteModelResponse* r) {
                               return impl_->stub->DeleteModel(c, request, r);
                             },
                             /*retry=*/false));
  return std::move(*deleted.mutable_model());
}

absl::StatusOr<v1::Job> Client::Submit(const v1::JobSpec& spec) { return Submit(spec, NewRequestId()); }

absl::StatusOr<v1::Job> Client::Submit(const v1::JobSpec& spec, const std::string& request_id) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  // The server returns the job a request_id made, so a retry after a lost reply does not
  // queue the work twice.
  request.set_request_id(request_id);
  return impl_->Unary<v1::Job>(
      [&](grpc::ClientContext* c, v1::Job* r) { return impl_->stub->SubmitJob(c, request, r); });
}

absl::StatusOr<v1::Job> Client::Get(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_id(job_id);
  return impl_->Unary<v1::Job>(
      [&](grpc::ClientContext* c, v1::Job* r) { return impl_->stub->GetJob(c, request, r); });
}

absl::StatusOr<v1::ListJobsResponse> Client::List(const std::vector<v1::JobState>& states, int page_size,
                                                  const std::string& page_token) {
  v1::ListJobsRequest request;
  for (v1::JobState state : states) request.add_states(state);
  request.set_page_size(page_size);
  request.set_page_token(page_token);
  return impl_->Unary<v1::ListJobsResponse>(
      [&](grpc::ClientContext* c, v1::ListJobsResponse* r) { return impl_->stub->ListJobs(c, request, r); });
}

absl::StatusOr<v1::Job> Client::Cancel(const std::string& job_id) {
  v1::CancelJobRequest request;
  request.set_id(job_id);
  // Retried: cancelling twice is the same as cancelling once (the job is returned either way).
  return impl_->Unary<v1::Job>(
      [&](grpc::ClientContext* c, v1::Job* r) { return impl_->stub->CancelJob(c, request, r); });
}

absl::StatusOr<v1::DeleteJobResponse> Client::DeleteJob(const std::string& job_id) {
  v1::DeleteJobRequest request;
  request.set_id(job_id);
  // Not retried, as DeleteModel: a second try after a lost reply would say NOT_FOUND.
  return impl_->Unary<v1::DeleteJobResponse>(
      [&](grpc::ClientContext* c, v1::DeleteJobResponse* r) { return impl_->stub->DeleteJob(c, request, r); },
      /*retry=*/false);
}

absl::StatusOr<v1::Usage> Client::GetUsage() {
  return impl_->Unary<v1::Usage>([&](grpc::ClientContext* c, v1::Usage* r) {
    return impl_->stub->GetUsage(c, v1::GetUsageRequest(), r);
  });
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo() {
  return impl_->Unary<v1::ServerInfo>([&](grpc::ClientContext* c, v1::ServerInfo* r) {
    return impl_->stub->GetServerInfo(c, v1::GetServerInfoRequest(), r);
  });
}

absl::StatusOr<std::string> Client::Health(const std::string& service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  auto response = impl_->Unary<grpc::health::v1::HealthCheckResponse>(
      [&](grpc::ClientContext* c, grpc::health::v1::HealthCheckResponse* r) {
        return impl_->health->Check(c, request, r);
      });
  if (!response.ok()) return response.status();
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response->status());
}

}  // namespace recal
