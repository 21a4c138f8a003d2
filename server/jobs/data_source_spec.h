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

// The canonical spec (data::DataSpecToString) of `source`, its path resolved under
// `data_roots`. INVALID_ARGUMENT naming the field for a malformed source (an image folder's
// resize, crop, mean, std, samples or on_bad; a tensor file's format, keys, scale, mean or
// std), checked before the path; then PERMISSION_DENIED for a path outside `data_roots`,
// NOT_FOUND for a missing file or folder, INVALID_ARGUMENT for an image_folder.path that is
// not a directory.
absl::StatusOr<std::string> DataSpecFor(const v1::DataSource& source,
                                        const std::vector<std::string>& data_roots);

}  // namespace recal::jobs
