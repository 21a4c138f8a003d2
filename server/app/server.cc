// Server: the role builders, reloading the auth file, the health watcher and the shutdown
// order. The steps the builders take are in server_steps.cc.
#include "server/app/server.h"

#include <chrono>
#include <utility>

#include "common/status_macros.h"
#include "server/app/access.h"
#include "server/app/worker_options.h"
#include "server/log/log.h"

namespace recal::app {
namespace {

std::string StoreSpec(const ServerOptions& options) {
  return options.store.empty() ? "sqlite:" + options.data_dir + "/recal.db" : options.store;
}

}  // namespace

Server::Server(Options options)
    : options_(std::move(options)), store_spec_(StoreSpec(options_)), worker_binary_(WorkerBinary(options_)) {}

Server::~Server() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Server>> Server::BuildAndStart(Options options) {
  std::unique_ptr<Server> server(new Server(std::move(options)));
  switch (server->options_.role) {
    case Role::kAll:
      RECAL_RETURN_IF_ERROR(server->BuildAll());
      break;
    case Role::kApi:
      RECAL_RETURN_IF_ERROR(server->BuildApi());
      break;
    case Role::kWorker:
      RECAL_RETURN_IF_ERROR(server->BuildWorker());
      break;
  }
  server->StartHealthWatcher();
  return server;
}

// Jobs run here, on this process's devices; a process alone on an SQLite file may take back
// every job left running at start.
absl::Status Server::BuildAll() {
  RECAL_RETURN_IF_ERROR(OpenAccess());
  RECAL_RETURN_IF_ERROR(OpenStorage());
  RECAL_RETURN_IF_ERROR(StartLocalWorkers());
  jobs::JobManagerOptions job_options = JobOptions();
  job_options.client_streams = true;
  RECAL_RETURN_IF_ERROR(StartJobs(job_options));
  return Serve(/*serves_api=*/true);
}

// An api replica starts no recal-worker (docs/cluster.md): the worker processes inspect its
// uploads and take the pushed batches of client-stream jobs, reached with the cluster secret.
absl::Status Server::BuildApi() {
  RECAL_ASSIGN_OR_RETURN(cluster_secret_, ClusterSecretFor(options_));
  RECAL_RETURN_IF_ERROR(OpenAccess());
  RECAL_RETURN_IF_ERROR(OpenStorage());
  RECAL_RETURN_IF_ERROR(MakeRunner());
  log::Info("recal-server: jobs and inspections of uploads run on the worker processes (--role=worker); "
            "this process starts no recal-worker");
  RECAL_RETURN_IF_ERROR(ConnectRelay());
  MakeModels(remote_inspector_.get());
  jobs::JobManagerOptions job_options = JobOptions();
  job_options.client_streams = true;
  job_options.relay = relay_client_.get();
  job_options.scheduler.pushes = jobs::SchedulerOptions::Pushes::kRelayed;
  RECAL_RETURN_IF_ERROR(StartJobs(job_options));
  return Serve(/*serves_api=*/true);
}

// A worker process serves health and metrics only (clients talk to the api processes); with
// the cluster secret, an internal endpoint the api replicas reach for inspections and relayed
// pushes, which a heartbeat tells them of. Retention is the api replicas' work.
absl::Status Server::BuildWorker() {
  RECAL_ASSIGN_OR_RETURN(cluster_secret_, ClusterSecretFor(options_));
  RECAL_RETURN_IF_ERROR(OpenAccess());
  RECAL_RETURN_IF_ERROR(OpenStorage());
  RECAL_RETURN_IF_ERROR(StartLocalWorkers());
  RECAL_RETURN_IF_ERROR(ServeInternalEndpoint());
  jobs::JobManagerOptions job_options = JobOptions();
  job_options.client_streams = false;
  job_options.scheduler.pushes = jobs::SchedulerOptions::Pushes::kRelayed;
  job_options.scheduler.relay_endpoint = internal_.advertised;
  RECAL_RETURN_IF_ERROR(StartJobs(job_options));
  if (internal_.server) {
    heartbeat_.emplace(metadata_.get(), jobs_->lease_owner(), internal_.advertised);
    heartbeat_->Start();
  }
  return Serve(/*serves_api=*/false);
}

// This process runs jobs and inspects uploads itself, on its own devices.
absl::Status Server::StartLocalWorkers() {
  RECAL_RETURN_IF_ERROR(ResolveDevices());
  RECAL_RETURN_IF_ERROR(MakeRunner());
  RECAL_RETURN_IF_ERROR(CheckWorker());
  MakeModels(runner_.get());
  return absl::OkStatus();
}

// Every process that serves the API sweeps; a worker serves health (and metrics) only.
absl::Status Server::Serve(bool serves_api) {
  MakeSweeper(/*start=*/serves_api);
  RECAL_RETURN_IF_ERROR(ServeMetrics());
  return ServeApi(/*register_api=*/serves_api);
}

void Server::ReloadAuth() {
  if (absl::Status reloaded = auth_->Reload(); !reloaded.ok()) {
    log::Error("recal-server: auth file not reloaded, the previous one stays",
               {{"error", std::string(reloaded.message())}});
    return;
  }
  log::Info("recal-server: auth file reloaded", {{"path", auth_->path()}});
  if (metrics_) {
    for (const std::string& tenant : auth_->Tenants()) metrics_->AddTenant(tenant);
  }
}

// A process that cannot reach the store can neither take jobs nor answer for them, so it says
// NOT_SERVING (a load balancer or Kubernetes routes around it). Below the disk floor it still
// serves, but refuses upload bytes: the health service's "recal.uploads" says so apart.
void Server::StartHealthWatcher() {
  health_watcher_ = std::thread([this] {
    HealthSeen seen;
    seen.disk_room = !disk_floor_->Below();  // said at start (MakeDiskFloor)
    if (options_.role != Role::kWorker) SetUploadsHealth(seen);
    std::unique_lock<std::mutex> lock(health_mu_);
    while (!health_cv_.wait_for(lock, std::chrono::seconds(2), [this] { return stopping_; })) {
      WatchHealth(seen);
    }
  });
}

void Server::WatchHealth(HealthSeen& seen) {
  const absl::StatusOr<int64_t> reached = metadata_->CountJobsInStates({v1::QUEUED});
  const bool disk_room = !disk_floor_->Below();
  if (reached.ok() == seen.store && disk_room == seen.disk_room) return;
  if (reached.ok() != seen.store) {
    seen.store = reached.ok();
    server_->GetHealthCheckService()->SetServingStatus(seen.store);  // every service name
    if (seen.store) {
      log::Info("recal-server: the store answers again: SERVING");
    } else {
      log::Error("recal-server: the store does not answer: NOT_SERVING",
                 {{"error", std::string(reached.status().message())}});
    }
  }
  if (disk_room != seen.disk_room) {
    seen.disk_room = disk_room;
    const absl::StatusOr<int64_t> free = disk_floor_->FreeBytes();
    log::Fields fields = {{"path", disk_floor_->dir()},
                          {"free_bytes", free.ok() ? *free : int64_t{-1}},
                          {"min_free_disk_bytes", disk_floor_->min_free_bytes()}};
    if (disk_room) {
      log::Info("recal-server: the upload disk has room again: uploads are taken", fields);
    } else {
      log::Warning("recal-server: the upload disk is below --min_free_disk_bytes: upload bytes are refused until "
                   "space is freed",
                   fields);
    }
  }
  if (options_.role != Role::kWorker) SetUploadsHealth(seen);
}

void Server::SetUploadsHealth(const HealthSeen& seen) {
  server_->GetHealthCheckService()->SetServingStatus(kUploadsHealthService, seen.store && seen.disk_room);
}

void Server::StopHealthWatcher() {
  {
    std::lock_guard<std::mutex> lock(health_mu_);
    stopping_ = true;
  }
  health_cv_.notify_all();
  if (health_watcher_.joinable()) health_watcher_.join();
}

void Server::Shutdown() {
  // A build that failed part way started no health watcher and serves nothing: its parts are
  // destroyed in reverse, as they were made.
  if (shut_down_ || !server_) return;
  shut_down_ = true;
  StopHealthWatcher();
  const absl::Duration deadline = options_.shutdown_timeout;
  server_->GetHealthCheckService()->SetServingStatus(false);
  if (heartbeat_) heartbeat_->Stop();
  sweeper_->Stop();
  jobs_->Shutdown(deadline);
  if (internal_.server) internal_.server->Shutdown(std::chrono::system_clock::now() + absl::ToChronoSeconds(deadline));
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoSeconds(deadline));
  exposer_.reset();
  log::Info("recal-server: stopped");
}

}  // namespace recal::app
