// How an uploaded archive is inspected before it is accepted: the seam between the models'
// registry and whatever runs the inspection. Locally it is WorkerRunner (a sandboxed
// recal-worker on this host); an api replica, which runs no recal-worker, has a worker process
// of its cluster do it (relay::RemoteInspector).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "server/jobs/inspection_slots.h"

namespace recal::jobs {

class ModelInspector {
 public:
  virtual ~ModelInspector() = default;

  // Validates the archive at `model_path`: the Model as the archive describes it, its
  // BatchNorm `layers` and its input contract (`inputs`), for the registry to fill in the
  // rest. INVALID_ARGUMENT (or the code the inspection ended with): refused, saying why.
  // UNAVAILABLE or RESOURCE_EXHAUSTED: nothing could inspect it now, which is no verdict on
  // the model.
  virtual absl::StatusOr<v1::Model> Inspect(const std::string& model_path) = 0;

  // Room on this host for one inspection, waited for before an upload is committed: refused
  // there (RESOURCE_EXHAUSTED / UNAVAILABLE, as Inspect), the upload stays staged, counted in
  // its tenant's quota and expiring when idle, instead of becoming a blob no model refers
  // to. An inspector whose bound lies elsewhere (a remote worker's) has none to give.
  virtual absl::StatusOr<InspectionSlots::Slot> Reserve() { return InspectionSlots::Slot(); }
  // Inspect, in the room Reserve gave (held until it returns).
  virtual absl::StatusOr<v1::Model> InspectReserved(const std::string& model_path, InspectionSlots::Slot room) {
    return Inspect(model_path);
  }
};

}  // namespace recal::jobs
