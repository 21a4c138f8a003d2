// The ModelInspector of an api replica, which runs no recal-worker: a worker process of the
// cluster inspects the upload (inspection_service.h). The archive goes over the relay's
// channels (relay_client.h: the cluster secret, TLS when configured) in chunks well within the
// message limit, to a worker heard from lately (endpoint_heartbeat.h), picked at random; a
// worker that cannot be reached (UNAVAILABLE), or that refuses this replica's secret, is
// passed over for the next. The verdict of the worker that inspected it is returned as it is,
// so that a refused model reads exactly as under --role=all.
//
// Room first (Reserve): the call that will carry the archive is opened before the upload is
// committed, and the worker answers once its host has room for the inspection; so an upload
// its host bound refuses is refused while still staged, never a blob that no model refers to.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/jobs/model_inspector.h"
#include "server/relay/endpoint_heartbeat.h"
#include "server/relay/relay_client.h"
#include "server/store/metadata_store.h"

namespace recal::relay {

struct RemoteInspectorOptions {
  absl::Duration live_within = store::kWorkerEndpointLiveWithin;
  // One worker's whole call: its wait for an inspection slot, the transfer, and the
  // inspection (whose own timeout, 10 minutes, ends first).
  absl::Duration deadline = absl::Minutes(20);
  int chunk_bytes = 1 << 20;  // at most half the relay's message limit
};

class RemoteInspector final : public jobs::ModelInspector {
 public:
  RemoteInspector(RelayClient* workers, store::MetadataStore* metadata, RemoteInspectorOptions options = {})
      : workers_(workers), metadata_(metadata), options_(options) {}

  // Reserve, then the archive to the worker that gave the room.
  absl::StatusOr<v1::Model> Inspect(const std::string& model_path) override;
  // Room at a live worker (ReserveAndInspect), held while the call is open. UNAVAILABLE
  // naming what to start when no live worker could be reached; RESOURCE_EXHAUSTED as the
  // worker's host bound answers; the store's own error when it does not answer.
  absl::StatusOr<std::unique_ptr<Room>> Reserve(int64_t archive_bytes) override;

 private:
  class ReservedCall;
  class UnreservedWorker;
  // The room at the worker at `address`; UNIMPLEMENTED from a worker older than
  // ReserveAndInspect.
  absl::StatusOr<std::unique_ptr<Room>> ReserveAt(const std::string& address, int64_t archive_bytes);
  // The archive to the worker at `address` with no room taken first (InspectModel): for a
  // worker older than ReserveAndInspect.
  absl::StatusOr<v1::Model> InspectAt(const std::string& address,
                                                            const std::string& model_path);
  // The chunk size the relay's message limit allows.
  int ChunkBytes() const;

  RelayClient* const workers_;
  store::MetadataStore* const metadata_;
  const RemoteInspectorOptions options_;
};

}  // namespace recal::relay
