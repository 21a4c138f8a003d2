// A job's data source checked field by field and its path resolved under the tenant's data
// roots, once, at admission (job_plan.h). Of the checks of a path against the roots, this one
// gives the clear error at submit; the guard is the worker's sandbox, which lets the worker
// read only under the roots whatever happens to the path after this check (a link swapped
// in); task_builder.cc checks the stored path again when the job runs, because the roots may
// have changed since (a restart with other --data_root flags).
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

// `source` as a job runs it: a tensor file's or image folder's path canonical under
// `data_roots`, an image folder's unset resize, crop, mean and std filled in (ImageNet's);
// the rest as given. INVALID_ARGUMENT naming the field for a malformed source (an image
// folder's resize, crop, mean, std, samples or on_bad; a tensor file's format, keys, scale,
// mean or std; a synthetic sample_shape), checked before the path; then PERMISSION_DENIED for
// a path outside `data_roots`, NOT_FOUND for a missing file or folder, INVALID_ARGUMENT for an
// image_folder.path that is not a directory. A source without a data spec (client_stream)
// has its normalisation checked only.
absl::StatusOr<v1::DataSource> ResolveDataSource(const v1::DataSource& source,
                                                 const std::vector<std::string>& data_roots);

}  // namespace recal::jobs
