#include "server/api/request_bounds.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/request_limits.h"

namespace recal::api {
namespace {

using ::testing::HasSubstr;

v1::SubmitJobRequest Job() {
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_model_id("resnet:3");
  request.mutable_spec()->set_batch_size(8);
  request.mutable_spec()->mutable_data()->mutable_tensor_file()->set_path("data/x.npy");
  return request;
}

// The status's message for a refused request, "" if accepted.
template <typename Request>
std::string Refusal(const Request& request) {
  const absl::Status status = CheckBounds(request);
  if (!status.ok()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  }
  return std::string(status.message());
}

TEST(RequestBoundsTest, TheLargestAllowedFieldsPass) {
  v1::SubmitJobRequest request = Job();
  request.set_request_id(std::string(limits::kMaxRequestIdBytes, 'r'));
  request.mutable_spec()->set_model_id(std::string(limits::kMaxModelReferenceBytes, 'm'));
  for (int i = 0; i < limits::kMaxLabels; ++i) {
    std::string key(limits::kMaxLabelKeyBytes, 'k');
    key.replace(0, 4, std::to_string(1000 + i));
    (*request.mutable_spec()->mutable_labels())[key] = std::string(limits::kMaxLabelValueBytes, 'v');
  }
  request.mutable_spec()->mutable_data()->mutable_tensor_file()->set_path(std::string(limits::kMaxPathBytes, 'p'));
  request.mutable_spec()->mutable_options()->set_include(std::string(limits::kMaxPatternBytes, 'i'));
  EXPECT_EQ(Refusal(request), "");
}

TEST(RequestBoundsTest, EachOversizedFieldIsNamedWithItsSizeAndLimit) {
  v1::SubmitJobRequest request = Job();
  (*request.mutable_spec()->mutable_labels())["name"] = std::string(6 << 20, 'x');
  EXPECT_THAT(Refusal(request), HasSubstr("spec.labels value is 6291456 bytes; at most 1024 are allowed"));

  request = Job();
  for (int i = 0; i < 1000; ++i) (*request.mutable_spec()->mutable_labels())[std::to_string(i)] = "v";
  EXPECT_THAT(Refusal(request), HasSubstr("spec.labels has 1000 entries; at most 64 are allowed"));

  request = Job();
  request.set_request_id(std::string(129, 'r'));
  EXPECT_THAT(Refusal(request), HasSubstr("request_id is 129 bytes; at most 128"));

  request = Job();
  request.mutable_spec()->set_model_id(std::string(257, 'm'));
  EXPECT_THAT(Refusal(request), HasSubstr("spec.model_id is 257 bytes; at most 256"));

  request = Job();
  request.mutable_spec()->mutable_options()->set_exclude(std::string(5000, '.'));
  EXPECT_THAT(Refusal(request), HasSubstr("spec.options.exclude is 5000 bytes"));

  request = Job();
  for (int i = 0; i < 5000; ++i) request.mutable_spec()->mutable_data()->mutable_tensor_file()->add_mean(0.5f);
  EXPECT_THAT(Refusal(request), HasSubstr("spec.data.tensor_file.mean has 5000 entries; at most 4096"));

  request = Job();
  request.mutable_spec()->mutable_data()->mutable_image_folder()->set_path(std::string(5000, 'p'));
  EXPECT_THAT(Refusal(request), HasSubstr("spec.data.image_folder.path is 5000 bytes; at most 4096"));

  request = Job();
  for (int i = 0; i < 17; ++i) request.mutable_spec()->mutable_data()->mutable_synthetic()->add_sample_shape(1);
  EXPECT_THAT(Refusal(request), HasSubstr("spec.data.synthetic.sample_shape has 17 entries; at most 16"));
}

// The refusal of a `Request` made by `fill`.
template <typename Request, typename Fill>
std::string RefusalOf(Fill fill) {
  Request request;
  fill(request);
  return Refusal(request);
}

TEST(RequestBoundsTest, IdsTokensTenantsAndNamesOfEveryRequestAreBounded) {
  const std::string huge(7 << 20, 'x');
  const auto refused = [](const std::string& refusal, const std::string& expected) {
    EXPECT_THAT(refusal, HasSubstr(expected));
  };
  refused(RefusalOf<v1::GetJobRequest>([&](auto& r) { r.set_id(huge); }), "id is 7340032 bytes; at most 128");
  refused(RefusalOf<v1::CancelJobRequest>([&](auto& r) { r.set_id(huge); }), "id is 7340032 bytes");
  refused(RefusalOf<v1::WatchJobRequest>([&](auto& r) { r.set_id(huge); }), "id is 7340032 bytes");
  refused(RefusalOf<v1::DownloadResultRequest>([&](auto& r) { r.set_job_id(huge); }), "job_id is 7340032 bytes");
  refused(RefusalOf<v1::ListJobsRequest>([&](auto& r) { r.set_page_token(huge); }),
          "page_token is 7340032 bytes; at most 256");
  refused(RefusalOf<v1::ListJobsRequest>([&](auto& r) { r.set_tenant(huge); }), "tenant is 7340032 bytes; at most 64");
  refused(RefusalOf<v1::ListJobsRequest>([&](auto& r) {
            for (int i = 0; i < 20; ++i) r.add_states(v1::QUEUED);
          }),
          "states has 20 entries");
  refused(RefusalOf<v1::ListModelsRequest>([&](auto& r) { r.set_name(huge); }), "name is 7340032 bytes; at most 128");
  refused(RefusalOf<v1::GetModelRequest>([&](auto& r) { r.set_id(huge); }), "id is 7340032 bytes; at most 256");
  refused(RefusalOf<v1::DeleteModelRequest>([&](auto& r) { r.set_tenant(huge); }), "tenant is 7340032 bytes");
  refused(RefusalOf<v1::DeleteJobRequest>([&](auto& r) { r.set_id(huge); }), "id is 7340032 bytes; at most 128");
  refused(RefusalOf<v1::DeleteJobRequest>([&](auto& r) { r.set_tenant(huge); }), "tenant is 7340032 bytes; at most 64");
  refused(RefusalOf<v1::GetUsageRequest>([&](auto& r) { r.set_tenant(huge); }), "tenant is 7340032 bytes; at most 64");
  refused(RefusalOf<v1::GetUploadStatusRequest>([&](auto& r) { r.set_sha256(huge); }),
          "sha256 is 7340032 bytes; at most 64");
  refused(RefusalOf<v1::UploadHeader>([&](auto& r) { r.set_name(huge); }), "header.name is 7340032 bytes; at most 128");
  refused(RefusalOf<v1::UploadHeader>([&](auto& r) { (*r.mutable_labels())[huge] = "v"; }),
          "header.labels key is 7340032 bytes; at most 128");
  refused(RefusalOf<v1::PushBatchesRequest>([&](auto& r) { r.set_job_id(huge); }), "job_id is 7340032 bytes");
  refused(RefusalOf<v1::PushBatchesRequest>([&](auto& r) {
            for (int i = 0; i < 65; ++i) r.add_inputs();
          }),
          "inputs has 65 entries; at most 64");
  refused(std::string(CheckAuthorization("Bearer " + huge).message()), "the authorization metadata is 7340039 bytes; at most 1024");
  // The largest allowed values pass.
  EXPECT_EQ(RefusalOf<v1::DeleteJobRequest>([&](auto& r) {
              r.set_id(std::string(limits::kMaxIdBytes, 'j'));
              r.set_tenant(std::string(limits::kMaxTenantBytes, 't'));
            }),
            "");
  EXPECT_EQ(RefusalOf<v1::GetUsageRequest>([&](auto& r) { r.set_tenant(std::string(limits::kMaxTenantBytes, 't')); }),
            "");
  EXPECT_TRUE(CheckAuthorization("Bearer " + std::string(64, 'a')).ok());
}

TEST(RequestBoundsTest, ATenantsPriorityStaysInItsRangeAndAnAdminsNeedNot) {
  EXPECT_TRUE(CheckPriority(auth::Role::kSubmit, limits::kMaxTenantPriority).ok());
  EXPECT_TRUE(CheckPriority(auth::Role::kSubmit, -limits::kMaxTenantPriority).ok());
  const absl::Status high = CheckPriority(auth::Role::kSubmit, 2147483647);
  EXPECT_EQ(high.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(high.message()), HasSubstr("spec.priority 2147483647 is outside -100..100"));
  EXPECT_EQ(CheckPriority(auth::Role::kSubmit, -101).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(CheckPriority(auth::Role::kAdmin, 2147483647).ok());
  EXPECT_TRUE(CheckPriority(auth::Role::kAdmin, -2147483647 - 1).ok());
}

}  // namespace
}  // namespace recal::api
