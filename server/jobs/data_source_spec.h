// A job's typed data source as the data layer's spec string, with paths checked against
// the server's data roots.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"

namespace recal::jobs {

// The data roots a tenant's jobs may read: the shared ones (--data_root=PATH) and its own
// (--data_root=TENANT=PATH).
struct DataRoots {
  std::vector<std::string> shared;
  std::map<std::string, std::vector<std::string>> by_tenant;

  std::vector<std::string> For(const std::string& tenant) const;
  // Every root of every tenant (the worker's sandbox is narrowed per job).
  std::vector<std::string> All() const;
  // Adds "PATH[,PATH...]" or "TENANT=PATH[,PATH...]" (a tenant is [A-Za-z0-9][A-Za-z0-9_.-]*).
  void Add(const std::string& flag_value);
};

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
