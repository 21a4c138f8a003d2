// How an uploaded archive is inspected before it is accepted: the seam between the models'
// registry and whatever runs the inspection. Locally it is WorkerRunner (a sandboxed
// recal-worker on this host); an api replica, which runs no recal-worker, has a worker process
// of its cluster do it (relay::RemoteInspector).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"

namespace recal::jobs {

class ModelInspector {
 public:
  // Room for one inspection, held from Reserve until it is destroyed.
  class Room {
   public:
    virtual ~Room() = default;
    // Inspect, in this room; called at most once.
    virtual absl::StatusOr<v1::Model> Inspect(const std::string& model_path) = 0;
  };

  virtual ~ModelInspector() = default;

  // Validates the archive at `model_path`: the Model as the archive describes it, its
  // BatchNorm `layers` and its input contract (`inputs`), for the registry to fill in the
  // rest. INVALID_ARGUMENT (or the code the inspection ended with): refused, saying why.
  // UNAVAILABLE or RESOURCE_EXHAUSTED: nothing could inspect it now, which is no verdict on
  // the model.
  virtual absl::StatusOr<v1::Model> Inspect(const std::string& model_path) = 0;

  // Room for inspecting an archive of `archive_bytes`, waited for before an upload is
  // committed: refused there (RESOURCE_EXHAUSTED / UNAVAILABLE, as Inspect), the upload stays
  // staged, counted in its tenant's quota and expiring when idle, instead of becoming a blob
  // no model refers to. The host whose bound it is may be this one (WorkerRunner) or a
  // worker's (RemoteInspector). By default, no bound: a room that calls Inspect.
  virtual absl::StatusOr<std::unique_ptr<Room>> Reserve(int64_t archive_bytes);
};

// The default Room: Inspect of its inspector, with no bound of its own.
class UnboundedRoom final : public ModelInspector::Room {
 public:
  explicit UnboundedRoom(ModelInspector* inspector) : inspector_(inspector) {}
  absl::StatusOr<v1::Model> Inspect(const std::string& model_path) override { return inspector_->Inspect(model_path); }

 private:
  ModelInspector* const inspector_;
};

inline absl::StatusOr<std::unique_ptr<ModelInspector::Room>> ModelInspector::Reserve(int64_t /*archive_bytes*/) {
  return std::make_unique<UnboundedRoom>(this);
}

}  // namespace recal::jobs
