// A job's typed data source as the data layer's spec string, with paths checked against
// the server's data roots.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"

namespace recal::jobs {

// What DataSpecFor returns for client_stream: batches arrive through PushBatches.
inline constexpr char kClientStreamSpec[] = "client_stream";

// PERMISSION_DENIED for paths outside `data_roots`, NOT_FOUND for missing files,
// INVALID_ARGUMENT for malformed sources, UNIMPLEMENTED for sources not served yet.
absl::StatusOr<std::string> DataSpecFor(const v1::DataSource& source,
                                        const std::vector<std::string>& data_roots);

}  // namespace recal::jobs
