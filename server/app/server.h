// recal-server as an object: built from typed options (server_options.h) by one function per
// role, serving until Shutdown, which stops its parts in the one order that loses nothing.
// server/main.cc parses flags into the options and calls RunServer; tests build servers in
// their own process.
//
//   all     the API and the workers in one process (SQLite, a local blob directory)
//   api     the API only: starts no recal-worker; uploads are inspected, and pushed batches
//           run, on the worker processes, reached over their internal endpoints
//   worker  runs jobs only; serves health (and metrics), plus the internal endpoint with the
//           cluster secret
//
// Health follows the store: a process that cannot reach it says NOT_SERVING. The health
// service's kUploadsHealthService also says NOT_SERVING while the disk uploads are staged on
// is below --min_free_disk_bytes (uploads are refused; everything else is served).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/api/listen_security.h"
#include "server/api/recal_service.h"
#include "server/app/server_options.h"
#include "server/auth/authenticator.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/model_registry.h"
#include "server/jobs/retention_sweeper.h"
#include "server/jobs/worker_runner.h"
#include "server/metrics/metrics.h"
#include "server/relay/endpoint_heartbeat.h"
#include "server/relay/inspection_service.h"
#include "server/relay/internal_endpoint.h"
#include "server/relay/relay_client.h"
#include "server/relay/relay_secret.h"
#include "server/relay/relay_service.h"
#include "server/relay/remote_inspector.h"
#include "server/store/blob_store.h"
#include "server/store/disk_floor.h"
#include "server/store/metadata_store.h"

namespace recal::app {

// The grpc.health.v1 service name that tells whether this process takes upload bytes.
inline constexpr char kUploadsHealthService[] = "recal.uploads";

class Server {
 public:
  using Options = ServerOptions;

  // Builds what `options.role` needs and starts serving. The first error stops the build,
  // with the message the flags' check gives (e.g. role api without internal_token_file).
  static absl::StatusOr<std::unique_ptr<Server>> BuildAndStart(Options options);

  ~Server();  // Shutdown(), if not called yet
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }            // the API (and health) port
  int metrics_port() const;                     // 0: no metrics endpoint
  const std::string& internal_address() const { return internal_.advertised; }  // role worker

  // SIGHUP: reads the auth file again; one that does not parse keeps the credentials in force.
  void ReloadAuth();

  // Health NOT_SERVING; then the heartbeat (no inspection is sent here any more), the
  // retention sweeper, the jobs (workers stop at a batch boundary, feeds close: relayed
  // streams end), the internal endpoint and the API, each within options.shutdown_timeout;
  // the metrics endpoint last.
  void Shutdown();

 private:
  explicit Server(Options options);

  absl::Status BuildAll();
  absl::Status BuildApi();
  absl::Status BuildWorker();

  // The steps the role builders take, in this order.
  absl::Status OpenAccess();   // callers' credentials, TLS, and the metrics registry
  absl::Status OpenStorage();  // data dir, blob store, its disk's floor, metadata store
  void MakeDiskFloor();
  absl::Status StartLocalWorkers();  // roles all and worker: devices, runner, sandbox, models
  absl::Status ResolveDevices();
  absl::Status MakeRunner();
  absl::Status CheckWorker();
  absl::Status ConnectRelay();  // role api: to the workers' internal endpoints
  void MakeModels(jobs::ModelInspector* inspector);
  absl::Status ServeInternalEndpoint();  // role worker, with the cluster secret
  jobs::JobManagerOptions JobOptions() const;
  absl::Status StartJobs(const jobs::JobManagerOptions& options);
  void MakeSweeper(bool start);
  absl::Status Serve(bool serves_api);  // the sweeper, metrics and the gRPC server
  absl::Status ServeMetrics();
  absl::Status ServeApi(bool register_api);
  // What the health watcher saw last: the store answering, the upload disk above its floor.
  struct HealthSeen {
    bool store = true;
    bool disk_room = true;
  };
  void StartHealthWatcher();
  void WatchHealth(HealthSeen& seen);  // one look, every 2 s
  void SetUploadsHealth(const HealthSeen& seen);
  void StopHealthWatcher();
  jobs::TenantLimits LimitsOf(const std::string& tenant) const;
  jobs::RetentionPolicy RetentionOf(const std::string& tenant) const;

  const Options options_;
  const std::string store_spec_;
  const std::string worker_binary_;
  // Members are destroyed in reverse: each part outlives what uses it.
  std::optional<relay::RelaySecret> cluster_secret_;
  std::unique_ptr<auth::Authenticator> auth_;
  api::TlsFiles tls_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  std::unique_ptr<store::BlobStore> blobs_;
  std::unique_ptr<store::DiskFloor> disk_floor_;
  std::unique_ptr<store::MetadataStore> metadata_;
  std::vector<std::string> devices_;
  // Outlives everything that counts into it; null without a metrics endpoint.
  std::unique_ptr<metrics::Metrics> metrics_;
  jobs::WorkerRunnerOptions worker_;
  std::unique_ptr<jobs::WorkerRunner> runner_;
  std::unique_ptr<relay::RelayClient> relay_client_;
  std::unique_ptr<relay::RemoteInspector> remote_inspector_;
  std::unique_ptr<jobs::ModelRegistry> models_;
  std::unique_ptr<relay::RelayService> relay_service_;
  std::unique_ptr<relay::InspectionService> inspection_service_;
  relay::InternalEndpoint internal_;
  std::unique_ptr<jobs::JobManager> jobs_;
  std::optional<relay::EndpointHeartbeat> heartbeat_;
  std::unique_ptr<jobs::RetentionSweeper> sweeper_;
  // After jobs_: it stops serving (its gauges read the jobs) before they go.
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<api::RecalService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  std::mutex health_mu_;
  std::condition_variable health_cv_;
  bool stopping_ = false;  // guarded by health_mu_
  std::thread health_watcher_;
  bool shut_down_ = false;
};

// What recal-server's main does with the options: blocks SIGTERM, SIGINT and SIGHUP (before
// any thread starts), builds and starts the server, reloads the auth file on SIGHUP, and on
// SIGTERM or SIGINT shuts down. The build's error, else OK once stopped.
absl::Status RunServer(ServerOptions options);

}  // namespace recal::app
