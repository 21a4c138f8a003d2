// How an uploaded archive is inspected before it is accepted: the seam between the models'
// registry and whatever runs the inspection. Locally it is WorkerRunner (a sandboxed
// recal-worker on this host); an api replica, which runs no recal-worker, has a worker process
// of its cluster do it (relay::RemoteInspector).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"

namespace recal::jobs {

class ModelInspector {
 public:
  virtual ~ModelInspector() = default;

  // Validates the archive at `model_path` and lists its BatchNorm layers. INVALID_ARGUMENT
  // (or the code the inspection ended with): refused, saying why. UNAVAILABLE or
  // RESOURCE_EXHAUSTED: nothing could inspect it now, which is no verdict on the model.
  virtual absl::StatusOr<std::vector<v1::BatchNormLayer>> Inspect(const std::string& model_path) = 0;
};

}  // namespace recal::jobs
