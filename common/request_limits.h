// The sizes a client may send in one request, and the byte budget of one listing page: the
// one place these numbers exist. The server refuses a request over any of them at its gRPC
// edge (server/api/request_bounds.h) before anything is stored or looked up, so nothing a
// client stored can later make a response too large to receive; clients may check them to
// refuse early. docs/security.md lists each with its field.
#pragma once

#include <cstdint>

namespace recal::limits {

// Names and references.
inline constexpr int64_t kMaxIdBytes = 128;              // job ids (the server makes "job-<16 hex>")
inline constexpr int64_t kMaxModelReferenceBytes = 256;  // "sha256:<64 hex>", a digest prefix, name[:version]
inline constexpr int64_t kMaxModelNameBytes = 128;       // an upload's name
inline constexpr int64_t kMaxSha256Bytes = 64;           // a hex digest
inline constexpr int64_t kMaxTenantBytes = 64;           // as common/tenant_name.h, or "*"
inline constexpr int64_t kMaxRequestIdBytes = 128;       // SubmitJobRequest.request_id
inline constexpr int64_t kMaxPageTokenBytes = 256;       // the server's tokens are ~20 bytes

// Labels of a job or a model.
inline constexpr int64_t kMaxLabels = 64;
inline constexpr int64_t kMaxLabelKeyBytes = 128;
inline constexpr int64_t kMaxLabelValueBytes = 1024;

// A job's data and engine options.
inline constexpr int64_t kMaxPathBytes = 4096;        // a file or folder under a data root
inline constexpr int64_t kMaxTensorKeys = 256;        // safetensors keys of a tensor file
inline constexpr int64_t kMaxTensorKeyBytes = 256;
inline constexpr int64_t kMaxChannelValues = 4096;    // mean / std: one per channel
inline constexpr int64_t kMaxShapeDims = 16;          // a synthetic sample's or a pushed tensor's shape
inline constexpr int64_t kMaxPatternBytes = 1024;     // options.include / exclude (regular expressions)
inline constexpr int64_t kMaxOptionBytes = 32;        // options.compute_dtype / memory_format
inline constexpr int64_t kMaxIterations = 20;         // options.iterations: passes over the data
inline constexpr int64_t kMaxStateFilters = 16;       // ListJobsRequest.states
inline constexpr int64_t kMaxPushedInputs = 64;       // a pushed batch's positional inputs

// Credentials as received: the "authorization" metadata ("Bearer " + the token).
inline constexpr int64_t kMaxAuthorizationBytes = 1024;

// The priority a tenant's submit role may give a job: -kMaxTenantPriority..kMaxTenantPriority
// (higher runs first). Only an admin may go beyond it, e.g. to run one job ahead of all.
inline constexpr int32_t kMaxTenantPriority = 100;

// A ListJobs / ListModels response stops adding items before it would exceed this many bytes
// (or half the server's --max_message_bytes if that is less), well below every client's
// receive limit (gRPC's default is 4 MiB); its next_page_token goes on from there.
inline constexpr int64_t kListPageBytes = int64_t{1} << 20;

}  // namespace recal::limits
