// The ModelInspector of an api replica, which runs no recal-worker: a worker process of the
// cluster inspects the upload (inspection_service.h). The archive goes over the relay's
// channels (relay_client.h: the cluster secret, TLS when configured) in chunks well within the
// message limit, to a worker heard from lately (endpoint_heartbeat.h), picked at random; a
// worker that cannot be reached (UNAVAILABLE), or that refuses this replica's secret, is
// passed over for the next. The verdict of the worker that inspected it is returned as it is,
// so that a refused model reads exactly as under --role=all.
#pragma once

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
  // One worker's whole call: the transfer, its wait for an inspection slot, and the inspection
  // (whose own timeout, 10 minutes, ends first).
  absl::Duration deadline = absl::Minutes(20);
  int chunk_bytes = 1 << 20;  // at most half the relay's message limit
};

class RemoteInspector final : public jobs::ModelInspector {
 public:
  RemoteInspector(RelayClient* workers, store::MetadataStore* metadata, RemoteInspectorOptions options = {})
      : workers_(workers), metadata_(metadata), options_(options) {}

  // UNAVAILABLE naming what to start when no live worker could be reached; the store's own
  // error when it does not answer.
  absl::StatusOr<v1::Model> Inspect(const std::string& model_path) override;

 private:
  absl::StatusOr<v1::Model> InspectAt(const std::string& address, const std::string& model_path);

  RelayClient* const workers_;
  store::MetadataStore* const metadata_;
  const RemoteInspectorOptions options_;
};

}  // namespace recal::relay
