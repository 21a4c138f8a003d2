// The one place a job's spec becomes its plan (recal.worker.v1.JobPlan): admission checks
// every field the engine and the data layer take, once, and resolves them (the data source
// under the tenant's roots, option names as enums). The plan is stored with the job and the
// worker runs it as it is; the server's own limits (batch size, shards, client streams) are
// JobManager's.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "recal/worker/v1/worker.pb.h"

namespace recal::jobs {

// The plan of `spec` (its model_id already resolved), or INVALID_ARGUMENT naming the first
// field no worker could run (options.max_batches or target_rel_error below 0, an estimator,
// modules, compute_dtype or memory_format that does not exist, the data source's fields),
// then the data source's path errors (ResolveDataSource).
absl::StatusOr<worker::v1::JobPlan> PlanJob(const v1::JobSpec& spec, const std::vector<std::string>& data_roots);

// At submit, before a worker is spent: the plan's data against the model's input contract
// (common/input_contract.h) where the data's shape is known without reading it
// (server/data_access/data_shape.h): INVALID_ARGUMENT naming the data, the input, the
// dimension, what the data gives, what the model was exported for and the fix. What is not
// known here (client streams, torch: files, objects in a bucket, a model stored before
// contracts) the worker checks on every batch, with the same words. And a folded model asked
// of TorchScript: FAILED_PRECONDITION (only torch.export programs are folded).
absl::Status CheckPlanFitsModel(const worker::v1::JobPlan& plan, const v1::Model& model);

// The spec's path (a tensor file's, an image folder's), or "" for data that has none.
const std::string& DataPath(const v1::DataSource& source);

}  // namespace recal::jobs
