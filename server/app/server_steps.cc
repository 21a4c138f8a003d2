// Server: the steps the role builders (server.cc) take, each making one part from the options.
#include <filesystem>
#include <system_error>
#include <utility>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "server/app/access.h"
#include "server/app/server.h"
#include "server/app/server_gauges.h"
#include "server/app/worker_options.h"
#include "server/data_access/object_storage.h"
#include "server/jobs/devices.h"
#include "server/log/log.h"
#include "server/store/open_blob_store.h"

namespace recal::app {

absl::Status Server::OpenAccess() {
  RECAL_ASSIGN_OR_RETURN(auth_, AuthenticatorFor(options_));
  tls_ = {options_.tls_cert, options_.tls_key, options_.tls_client_ca};
  RECAL_ASSIGN_OR_RETURN(credentials_, api::ServerCredentialsFor(tls_));
  if (!options_.metrics_listen.empty()) {
    metrics_ = std::make_unique<metrics::Metrics>(std::string(RoleName(options_.role)));
    for (const std::string& tenant : auth_->Tenants()) metrics_->AddTenant(tenant);
  }
  return absl::OkStatus();
}

absl::Status Server::OpenStorage() {
  std::error_code error;
  std::filesystem::create_directories(options_.data_dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", options_.data_dir, ": ", error.message()));
  RECAL_ASSIGN_OR_RETURN(
      store::OpenedBlobStore opened,
      store::OpenBlobStore({.spec = options_.blobs,
                            .data_dir = options_.data_dir,
                            .object_storage = [this] { return data::ObjectStorageOptions(options_.s3); },
                            .part_bytes = options_.blob_part_bytes,
                            .cache_bytes = options_.blob_cache_bytes}));
  // The endpoint may come up after the server: jobs fail UNAVAILABLE until it does.
  if (!opened.reachable.ok()) {
    log::Warning(absl::StrCat("recal-server: blob store not reachable yet: ", opened.reachable.message()));
  }
  blobs_ = std::move(opened.store);
  MakeDiskFloor();
  RECAL_ASSIGN_OR_RETURN(metadata_, store::OpenMetadataStore(store_spec_, options_.store_connections));
  return absl::OkStatus();
}

// Uploads are staged beside the scratch directory (the blob directory's, or DATA_DIR's with
// s3://), on the disk whose space they take.
void Server::MakeDiskFloor() {
  disk_floor_ = std::make_unique<store::DiskFloor>(blobs_->scratch_dir(), options_.min_free_disk_bytes);
  const absl::StatusOr<int64_t> free = disk_floor_->FreeBytes();
  log::Info("recal-server: uploads keep free space on their disk",
            {{"path", blobs_->scratch_dir()},
             {"min_free_disk_bytes", options_.min_free_disk_bytes},
             {"free_bytes", free.ok() ? *free : int64_t{-1}}});
  if (disk_floor_->Below()) {
    log::Warning("recal-server: the disk uploads are staged on is below --min_free_disk_bytes: uploads are refused "
                 "until space is freed",
                 {{"path", blobs_->scratch_dir()}, {"free_bytes", free.ok() ? *free : int64_t{-1}}});
  }
}

// Counted with recal-worker, which runs on the devices (this process loads no LibTorch), as
// the user its workers run as, and only for a devices option that names CUDA.
absl::Status Server::ResolveDevices() {
  RECAL_ASSIGN_OR_RETURN(devices_, jobs::ResolveDevices(options_.devices, options_.cpu_workers, [this] {
                           return jobs::CountCudaDevices(worker_binary_, options_.worker_user);
                         }));
  return absl::OkStatus();
}

absl::Status Server::MakeRunner() {
  RECAL_ASSIGN_OR_RETURN(worker_, WorkerRunnerOptionsFor(options_, worker_binary_, blobs_->scratch_dir()));
  runner_ = std::make_unique<jobs::WorkerRunner>(worker_);
  return absl::OkStatus();
}

// Said once at start: that a worker runs LibTorch under the limits its tasks get, what the
// sandbox holds on this machine, and by name what it cannot.
absl::Status Server::CheckWorker() {
  auto sandbox = runner_->CheckWorker();
  if (!sandbox.ok()) {
    return absl::Status(sandbox.status().code(),
                        absl::StrCat("the worker does not start: ", sandbox.status().message()));
  }
  log::Info("recal-server: jobs run in sandboxed workers",
            {{"worker", worker_.binary}, {"enforced", absl::StrJoin(sandbox->enforced(), ", ")}});
  for (const std::string& missing : sandbox->missing()) {
    log::Warning(absl::StrCat("recal-server: sandbox: not enforced on this machine: ", missing));
  }
  return absl::OkStatus();
}

// The connections to the workers' internal endpoints: the inspections of this replica's
// uploads, and the pushed batches of client-stream jobs.
absl::Status Server::ConnectRelay() {
  RECAL_ASSIGN_OR_RETURN(relay_client_, relay::RelayClient::Make(*cluster_secret_,
                                                                 {.tls_ca = options_.internal_tls_ca,
                                                                  .tls_cert = tls_.cert,
                                                                  .tls_key = tls_.key,
                                                                  .max_message_bytes = options_.max_message_bytes}));
  remote_inspector_ = std::make_unique<relay::RemoteInspector>(relay_client_.get(), metadata_.get());
  return absl::OkStatus();
}

void Server::MakeModels(jobs::ModelInspector* inspector) {
  models_ = std::make_unique<jobs::ModelRegistry>(metadata_.get(), blobs_.get(), options_.max_model_bytes, inspector,
                                                  [this](const std::string& tenant) { return LimitsOf(tenant); });
  models_->SetInspectionWait(options_.inspection_wait);
  models_->SetDiskFloor(disk_floor_.get());
}

// Client streams across processes (docs/cluster.md): the api replicas relay pushes here, and
// send the uploads they take to be inspected; only with the cluster secret.
absl::Status Server::ServeInternalEndpoint() {
  if (!cluster_secret_) {
    log::Warning("recal-server: no --internal_token_file: api replicas cannot reach this worker, so it "
                 "inspects none of their uploads, and client-stream jobs it takes fail");
    return absl::OkStatus();
  }
  relay_service_ = std::make_unique<relay::RelayService>(*cluster_secret_);
  inspection_service_ = std::make_unique<relay::InspectionService>(
      *cluster_secret_, runner_.get(), relay::InspectionServiceOptions{options_.max_model_bytes, worker_.scratch_root});
  RECAL_ASSIGN_OR_RETURN(internal_, relay::ServeInternal(options_.internal_listen, options_.advertise_address,
                                                         credentials_,
                                                         {relay_service_.get(), inspection_service_.get()},
                                                         options_.max_message_bytes));
  log::Info("recal-server: internal endpoint for inspections and relayed pushes",
            {{"listen", options_.internal_listen}, {"advertised", internal_.advertised}});
  return absl::OkStatus();
}

jobs::JobManagerOptions Server::JobOptions() const {
  jobs::JobManagerOptions options;
  options.scheduler.devices = devices_;
  options.scheduler.lease = options_.lease;
  options.scheduler.max_queued_jobs = options_.max_queued_jobs;
  options.scheduler.data_roots = options_.data_roots;
  options.scheduler.default_timeout_seconds = absl::ToDoubleSeconds(options_.job_timeout);
  options.scheduler.stream_idle = options_.stream_idle;
  options.scheduler.metrics = metrics_.get();
  options.scheduler.max_attempts = std::max(1, options_.max_attempts);
  // Only a process alone on its store (role all on an SQLite file) may take back every job left
  // running at start; any other takes back only expired leases. A worker that took them all
  // would stop the runs of the other workers (their leases are live) each time it starts.
  options.scheduler.recover_all_at_start = options_.role == Role::kAll && absl::StartsWith(store_spec_, "sqlite:");
  options.relay_wait = options_.relay_wait;
  options.max_batch_size = options_.max_batch_size;
  options.max_batch_bytes = options_.max_batch_bytes;
  options.limits = [this](const std::string& tenant) { return LimitsOf(tenant); };
  return options;
}

absl::Status Server::StartJobs(const jobs::JobManagerOptions& options) {
  jobs_ = std::make_unique<jobs::JobManager>(metadata_.get(), blobs_.get(), models_.get(), runner_.get(), options);
  if (relay_service_) relay_service_->Bind(jobs_.get());
  return jobs_->Start();
}

// Every process that serves the API sweeps (with blobs in a bucket each stages its own
// uploads); what it does is safe when replicas do it at once (retention_sweeper.h).
void Server::MakeSweeper(bool start) {
  sweeper_ = std::make_unique<jobs::RetentionSweeper>(
      metadata_.get(), blobs_.get(),
      jobs::SweeperOptions{.retention = [this](const std::string& tenant) { return RetentionOf(tenant); },
                           .upload_idle = options_.upload_idle,
                           .interval = options_.retention_interval});
  if (start && options_.retention_interval > absl::ZeroDuration()) sweeper_->Start();
}

absl::Status Server::ServeMetrics() {
  if (!metrics_) return absl::OkStatus();
  RECAL_ASSIGN_OR_RETURN(exposer_, metrics::Serve(options_.metrics_listen, metrics_.get(),
                                                  ServerGauges(jobs_.get(), worker_.inspections.get(),
                                                               models_.get(), auth_.get(), disk_floor_.get())));
  log::Info(absl::StrCat("recal-server: metrics on port ", metrics::PortOf(*exposer_)),
            {{"address", options_.metrics_listen}, {"path", "/metrics"}});
  return absl::OkStatus();
}

int Server::metrics_port() const { return exposer_ ? metrics::PortOf(*exposer_) : 0; }

absl::Status Server::ServeApi(bool register_api) {
  service_ = std::make_unique<api::RecalService>(
      auth_.get(), models_.get(), jobs_.get(),
      api::RecalService::Limits{.download_chunk_bytes = options_.download_chunk_bytes,
                                .max_message_bytes = options_.max_message_bytes},
      metrics_.get());
  grpc::EnableDefaultHealthCheckService(true);
  if (options_.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.listen, credentials_, &port_);
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  if (register_api) builder.RegisterService(service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<metrics::ServerInterceptorFactory>(metrics_.get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen));
  }
  log::Info(absl::StrCat("recal-server: listening on port ", port_),
            {{"address", options_.listen},
             {"auth", auth_->enabled() ? auth_->path() : "none (loopback)"},
             {"tls", tls_.cert.empty() ? "off" : tls_.client_ca.empty() ? "on" : "mutual"},
             {"data_dir", options_.data_dir},
             {"store", store_spec_.substr(0, store_spec_.find(':'))},  // never the URI: it may hold a password
             {"blobs", blobs_->Describe()},
             {"role", std::string(RoleName(options_.role))},
             {"workers", static_cast<int64_t>(devices_.size())},
             {"version", Version()}});
  return absl::OkStatus();
}

jobs::TenantLimits Server::LimitsOf(const std::string& tenant) const {
  const auth::TenantQuotas quotas = auth_->QuotasOf(tenant);
  const auto or_option = [](int64_t value, int64_t server_default) { return value > 0 ? value : server_default; };
  return jobs::TenantLimits{quotas.max_active_jobs, quotas.max_stored_bytes, quotas.max_submissions_per_minute,
                            or_option(quotas.max_concurrent_inspections, options_.tenant_max_concurrent_inspections),
                            or_option(quotas.max_running_jobs, options_.tenant_max_running_jobs)};
}

jobs::RetentionPolicy Server::RetentionOf(const std::string& tenant) const {
  const auth::TenantQuotas quotas = auth_->QuotasOf(tenant);
  const auto or_default = [](int64_t value, int64_t server_default) {
    return value == auth::kRetentionDefault ? server_default : value;
  };
  return jobs::RetentionPolicy{or_default(quotas.keep_versions, options_.keep_versions),
                               or_default(quotas.keep_results_days, options_.keep_results_days)};
}

}  // namespace recal::app
