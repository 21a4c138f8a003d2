// Every client-controlled string and repeated field of a request against its limit
// (common/request_limits.h), checked once where the request comes in, before any store
// access. INVALID_ARGUMENT naming the field, its size and the limit, e.g.
//   "spec.labels key is 6291456 bytes; at most 128 are allowed".
// Numbers with a range (batch_size, shards, ...) are the domain's to check; the priority,
// whose range depends on the caller's role, is checked here too.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "recal/v1/recal.pb.h"
#include "server/auth/auth_file.h"

namespace recal::api {

// "<field> is N bytes; at most L are allowed" when size > limit.
absl::Status CheckBytes(absl::string_view field, int64_t size, int64_t limit);
// "<field> has N entries; at most L are allowed" when count > limit.
absl::Status CheckCount(absl::string_view field, int64_t count, int64_t limit);

// The authorization metadata as received (before any look-up).
absl::Status CheckAuthorization(absl::string_view authorization);

absl::Status CheckBounds(const v1::UploadHeader& header);
absl::Status CheckBounds(const v1::GetUploadStatusRequest& request);
absl::Status CheckBounds(const v1::GetModelRequest& request);
absl::Status CheckBounds(const v1::ListModelsRequest& request);
absl::Status CheckBounds(const v1::DeleteModelRequest& request);
absl::Status CheckBounds(const v1::SubmitJobRequest& request);
absl::Status CheckBounds(const v1::GetJobRequest& request);
absl::Status CheckBounds(const v1::ListJobsRequest& request);
absl::Status CheckBounds(const v1::CancelJobRequest& request);
absl::Status CheckBounds(const v1::DeleteJobRequest& request);
absl::Status CheckBounds(const v1::GetUsageRequest& request);
absl::Status CheckBounds(const v1::WatchJobRequest& request);
// Each message of the stream (the job id is the first message's; the data of each input is
// held to --max_batch_bytes by the job's feed).
absl::Status CheckBounds(const v1::PushBatchesRequest& request);
absl::Status CheckBounds(const v1::DownloadResultRequest& request);

// A job's priority: -kMaxTenantPriority..kMaxTenantPriority for every role, any int32 for an
// admin. PERMISSION_DENIED otherwise (the request is well formed; the caller may not ask for
// that much), naming the range.
absl::Status CheckPriority(auth::Role role, int32_t priority);

}  // namespace recal::api
