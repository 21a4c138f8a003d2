#include "server/api/request_bounds.h"

#include "absl/strings/str_cat.h"
#include "common/request_limits.h"
#include "common/status_macros.h"

namespace recal::api {

using namespace ::recal::limits;  // NOLINT: the limits read as their names below

namespace {

absl::Status CheckLabels(absl::string_view field, const google::protobuf::Map<std::string, std::string>& labels) {
  RECAL_RETURN_IF_ERROR(CheckCount(field, labels.size(), kMaxLabels));
  for (const auto& [key, value] : labels) {
    RECAL_RETURN_IF_ERROR(CheckBytes(absl::StrCat(field, " key"), key.size(), kMaxLabelKeyBytes));
    RECAL_RETURN_IF_ERROR(CheckBytes(absl::StrCat(field, " value"), value.size(), kMaxLabelValueBytes));
  }
  return absl::OkStatus();
}

absl::Status CheckChannels(absl::string_view source, int mean, int std) {
  RECAL_RETURN_IF_ERROR(CheckCount(absl::StrCat(source, ".mean"), mean, kMaxChannelValues));
  return CheckCount(absl::StrCat(source, ".std"), std, kMaxChannelValues);
}

absl::Status CheckData(const v1::DataSource& data) {
  if (data.has_tensor_file()) {
    const v1::TensorFileSource& file = data.tensor_file();
    RECAL_RETURN_IF_ERROR(CheckBytes("spec.data.tensor_file.path", file.path().size(), kMaxPathBytes));
    RECAL_RETURN_IF_ERROR(CheckCount("spec.data.tensor_file.keys", file.keys_size(), kMaxTensorKeys));
    for (const std::string& key : file.keys()) {
      RECAL_RETURN_IF_ERROR(CheckBytes("spec.data.tensor_file.keys entry", key.size(), kMaxTensorKeyBytes));
    }
    return CheckChannels("spec.data.tensor_file", file.mean_size(), file.std_size());
  }
  if (data.has_synthetic()) {
    return CheckCount("spec.data.synthetic.sample_shape", data.synthetic().sample_shape_size(), kMaxShapeDims);
  }
  if (data.has_client_stream()) {
    return CheckChannels("spec.data.client_stream", data.client_stream().mean_size(), data.client_stream().std_size());
  }
  if (data.has_image_folder()) {
    const v1::ImageFolderSource& folder = data.image_folder();
    RECAL_RETURN_IF_ERROR(CheckBytes("spec.data.image_folder.path", folder.path().size(), kMaxPathBytes));
    return CheckChannels("spec.data.image_folder", folder.mean_size(), folder.std_size());
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const v1::EngineOptions& options) {
  RECAL_RETURN_IF_ERROR(CheckBytes("spec.options.include", options.include().size(), kMaxPatternBytes));
  RECAL_RETURN_IF_ERROR(CheckBytes("spec.options.exclude", options.exclude().size(), kMaxPatternBytes));
  RECAL_RETURN_IF_ERROR(CheckBytes("spec.options.compute_dtype", options.compute_dtype().size(), kMaxOptionBytes));
  return CheckBytes("spec.options.memory_format", options.memory_format().size(), kMaxOptionBytes);
}

}  // namespace

absl::Status CheckBytes(absl::string_view field, int64_t size, int64_t limit) {
  if (size <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", size, " bytes; at most ", limit, " are allowed (docs/security.md lists the limits)"));
}

absl::Status CheckCount(absl::string_view field, int64_t count, int64_t limit) {
  if (count <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " has ", count, " entries; at most ", limit,
                                                 " are allowed (docs/security.md lists the limits)"));
}

absl::Status CheckAuthorization(absl::string_view authorization) {
  return CheckBytes("the authorization metadata", authorization.size(), kMaxAuthorizationBytes);
}

absl::Status CheckBounds(const v1::UploadHeader& header) {
  RECAL_RETURN_IF_ERROR(CheckBytes("header.name", header.name().size(), kMaxModelNameBytes));
  RECAL_RETURN_IF_ERROR(CheckBytes("header.sha256", header.sha256().size(), kMaxSha256Bytes));
  return CheckLabels("header.labels", header.labels());
}

absl::Status CheckBounds(const v1::GetUploadStatusRequest& request) {
  return CheckBytes("sha256", request.sha256().size(), kMaxSha256Bytes);
}

absl::Status CheckBounds(const v1::GetModelRequest& request) {
  return CheckBytes("id", request.id().size(), kMaxModelReferenceBytes);
}

absl::Status CheckBounds(const v1::ListModelsRequest& request) {
  RECAL_RETURN_IF_ERROR(CheckBytes("page_token", request.page_token().size(), kMaxPageTokenBytes));
  RECAL_RETURN_IF_ERROR(CheckBytes("tenant", request.tenant().size(), kMaxTenantBytes));
  return CheckBytes("name", request.name().size(), kMaxModelNameBytes);
}

absl::Status CheckBounds(const v1::DeleteModelRequest& request) {
  RECAL_RETURN_IF_ERROR(CheckBytes("id", request.id().size(), kMaxModelReferenceBytes));
  return CheckBytes("tenant", request.tenant().size(), kMaxTenantBytes);
}

absl::Status CheckBounds(const v1::SubmitJobRequest& request) {
  RECAL_RETURN_IF_ERROR(CheckBytes("request_id", request.request_id().size(), kMaxRequestIdBytes));
  const v1::JobSpec& spec = request.spec();
  RECAL_RETURN_IF_ERROR(CheckBytes("spec.model_id", spec.model_id().size(), kMaxModelReferenceBytes));
  RECAL_RETURN_IF_ERROR(CheckLabels("spec.labels", spec.labels()));
  RECAL_RETURN_IF_ERROR(CheckData(spec.data()));
  return CheckOptions(spec.options());
}

absl::Status CheckBounds(const v1::GetJobRequest& request) { return CheckBytes("id", request.id().size(), kMaxIdBytes); }

absl::Status CheckBounds(const v1::ListJobsRequest& request) {
  RECAL_RETURN_IF_ERROR(CheckCount("states", request.states_size(), kMaxStateFilters));
  RECAL_RETURN_IF_ERROR(CheckBytes("page_token", request.page_token().size(), kMaxPageTokenBytes));
  return CheckBytes("tenant", request.tenant().size(), kMaxTenantBytes);
}

absl::Status CheckBounds(const v1::CancelJobRequest& request) {
  return CheckBytes("id", request.id().size(), kMaxIdBytes);
}

absl::Status CheckBounds(const v1::DeleteJobRequest& request) {
  RECAL_RETURN_IF_ERROR(CheckBytes("id", request.id().size(), kMaxIdBytes));
  return CheckBytes("tenant", request.tenant().size(), kMaxTenantBytes);
}

absl::Status CheckBounds(const v1::GetUsageRequest& request) {
  return CheckBytes("tenant", request.tenant().size(), kMaxTenantBytes);
}

absl::Status CheckBounds(const v1::WatchJobRequest& request) {
  return CheckBytes("id", request.id().size(), kMaxIdBytes);
}

absl::Status CheckBounds(const v1::PushBatchesRequest& request) {
  RECAL_RETURN_IF_ERROR(CheckBytes("job_id", request.job_id().size(), kMaxIdBytes));
  RECAL_RETURN_IF_ERROR(CheckCount("inputs", request.inputs_size(), kMaxPushedInputs));
  for (const v1::Tensor& input : request.inputs()) {
    RECAL_RETURN_IF_ERROR(CheckCount("inputs shape", input.shape_size(), kMaxShapeDims));
  }
  return absl::OkStatus();
}

absl::Status CheckBounds(const v1::DownloadResultRequest& request) {
  return CheckBytes("job_id", request.job_id().size(), kMaxIdBytes);
}

absl::Status CheckPriority(auth::Role role, int32_t priority) {
  if (role == auth::Role::kAdmin || (priority >= -kMaxTenantPriority && priority <= kMaxTenantPriority)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat("spec.priority ", priority, " is outside -", kMaxTenantPriority, "..",
                                                  kMaxTenantPriority, ", the range a tenant may set; only an admin may "
                                                  "give a job a priority beyond it"));
}

}  // namespace recal::api
