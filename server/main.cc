// recal-server: the gRPC service, embedded by default (SQLite metadata and blobs under
// --data_dir). SIGTERM / SIGINT: health goes NOT_SERVING, workers stop at a batch
// boundary (their jobs stay QUEUED for the next start), watchers are ended, and the
// process exits within --shutdown_timeout_seconds. SIGHUP: the auth file is read again.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "server/api/listen_security.h"
#include "server/api/recal_service.h"
#include "server/auth/authenticator.h"
#include "server/data_access/object_storage.h"
#include "server/data_access/s3_paths.h"
#include "server/jobs/devices.h"
#include "server/jobs/job_manager.h"
#include "server/jobs/model_registry.h"
#include "server/jobs/retention_sweeper.h"
#include "server/jobs/worker_runner.h"
#include "common/command_line.h"
#include "common/version.h"
#include "server/log/log.h"
#include "server/metrics/metrics.h"
#include "server/relay/endpoint_heartbeat.h"
#include "server/relay/inspection_service.h"
#include "server/relay/internal_endpoint.h"
#include "server/relay/relay_client.h"
#include "server/relay/relay_service.h"
#include "server/relay/remote_inspector.h"
#include "server/s3/s3_flags.h"
#include "server/store/blob_store.h"
#include "server/store/metadata_store.h"
#include "server/store/open_blob_store.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "address to serve gRPC on (port 0: any free port); beyond loopback it needs --auth_file "
          "(or --allow_unauthenticated)");
ABSL_FLAG(std::string, auth_file, "",
          "credentials, roles, tenants and quotas (docs/security.md, 'Identities and tenants'); re-read on SIGHUP. "
          "Without it every caller is admin of the tenant 'default'");
ABSL_FLAG(bool, allow_unauthenticated, false, "serve beyond loopback without --auth_file (anyone may do anything)");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain to serve TLS with (re-read when it changes)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM roots: clients must present a certificate they signed (mTLS); its subject or SAN is looked up "
          "in --auth_file as cert:<name>");
ABSL_FLAG(bool, reflection, false, "serve gRPC server reflection");
ABSL_FLAG(std::string, data_dir, "./recal-data", "where models, results and the metadata DB live by default");
ABSL_FLAG(std::string, store, "",
          "the metadata store: sqlite:PATH (default: DATA_DIR/recal.db) or postgresql://USER@HOST:PORT/DB "
          "(libpq URI; a password is better kept in PGPASSFILE than in the URI)");
ABSL_FLAG(std::string, role, "all",
          "all: API and workers in one process (the default); api: the API only (stateless, any number of "
          "replicas); worker: runs jobs only (serves health). api and worker share --store and --blobs");
ABSL_FLAG(std::string, internal_token_file, "",
          "cluster mode: the shared secret (a file, at least 32 characters) that admits api replicas to the "
          "workers' internal endpoints, where workers inspect the replicas' uploads and take the pushed batches "
          "of client-stream jobs. Same file on every api and worker process; role=api requires it");
ABSL_FLAG(std::string, internal_listen, "0.0.0.0:50052",
          "role=worker with --internal_token_file: where api replicas send uploads to inspect and relay pushed "
          "batches (port 0: any free port)");
ABSL_FLAG(std::string, advertise_address, "",
          "role=worker: HOST[:PORT] api replicas reach --internal_listen at, recorded in the store (default: the "
          "host listened on, or this host's name for a wildcard; the port listened on)");
ABSL_FLAG(std::string, internal_tls_ca, "",
          "role=api: PEM roots that signed the workers' certificates: relay over TLS (workers serve their "
          "internal endpoint with --tls_cert/--tls_key; the api presents its own to workers with --tls_client_ca)");
ABSL_FLAG(double, relay_wait_seconds, 60,
          "role=api: how long a push to a client-stream job waits for a worker to take the job up before "
          "UNAVAILABLE (push again)");
ABSL_FLAG(double, lease_seconds, 30,
          "a worker's hold on a running job; a worker that stops renewing it loses the job to another after this");
ABSL_FLAG(std::string, blobs, "",
          "where models and results live: file:DIR (default: DATA_DIR) or s3://BUCKET/PREFIX (object storage "
          "configured by the --s3_* flags; staged uploads and a cache of models stay under DATA_DIR/s3-blobs)");
ABSL_FLAG(int64_t, blob_part_bytes, int64_t{64} << 20,
          "--blobs=s3://: blobs larger than this are sent as multipart uploads of parts this size (at least 5 MiB)");
ABSL_FLAG(std::vector<std::string>, data_root, {},
          "directories jobs may read data from (comma-separated, and the flag may repeat): PATH for every "
          "tenant, TENANT=PATH for one; nothing else is readable. s3://BUCKET/PREFIX: objects in a bucket, read "
          "with the --s3_* configuration by the server for its sandboxed workers");
ABSL_FLAG(std::string, devices, "cpu", "cpu | auto | cuda:0,cuda:1 (one worker per device)");
ABSL_FLAG(int32_t, cpu_workers, 1, "workers when --devices=cpu (or auto without CUDA)");
ABSL_FLAG(int32_t, threads_per_worker, 0, "intra-op threads of each worker (0: LibTorch's default)");
ABSL_FLAG(int32_t, prefetch_depth, 2, "batches each job prepares ahead on a background thread (0: none)");
ABSL_FLAG(int32_t, decode_threads, 0, "image-folder jobs: decoding threads per job (0: the cores, at most 8)");
ABSL_FLAG(int32_t, max_queued_jobs, 64, "jobs waiting at most; beyond it SubmitJob is RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_model_bytes, int64_t{2} << 30, "largest model archive accepted");
ABSL_FLAG(int32_t, max_message_bytes, 8 << 20, "largest gRPC message accepted");
ABSL_FLAG(int64_t, max_batch_size, 4096, "largest batch_size a job may ask for");
ABSL_FLAG(int64_t, max_batch_bytes, int64_t{256} << 20, "largest batch a client may push (PushBatches), all its inputs together");
ABSL_FLAG(double, job_timeout_seconds, 6 * 3600, "a job's time limit unless its spec sets one");
ABSL_FLAG(double, stream_idle_seconds, 300,
          "a client_stream job fails when no batch is pushed for this long, giving its worker back");
ABSL_FLAG(double, shutdown_timeout_seconds, 20, "how long SIGTERM waits for workers and calls");
ABSL_FLAG(std::string, worker_binary, "",
          "recal-worker, which runs every model (default: beside recal-server); role=api starts none");
ABSL_FLAG(int64_t, job_memory_bytes, int64_t{16} << 30, "address space of each job's worker (RLIMIT_AS); 0: no limit");
ABSL_FLAG(int64_t, inspection_memory_bytes, int64_t{4} << 30,
          "address space of each upload-inspecting worker (RLIMIT_AS), far below a job's; 0: --job_memory_bytes");
ABSL_FLAG(int32_t, max_concurrent_inspections, 4,
          "upload inspections running at once on this host; beyond it they queue (0: no count bound)");
ABSL_FLAG(int64_t, inspection_memory_total, 0,
          "the sum of the memory caps of the inspections running at once on this host (0: a quarter of MemTotal, "
          "at least one inspection's); "
          "beyond it they queue");
ABSL_FLAG(double, inspection_wait_seconds, 120,
          "how long an upload waits for an inspection slot before it fails RESOURCE_EXHAUSTED (retry later)");
ABSL_FLAG(int32_t, tenant_max_concurrent_inspections, 2,
          "uploads of one tenant inspected at once unless its auth-file line sets max_concurrent_inspections "
          "(0: no bound)");
ABSL_FLAG(int32_t, tenant_max_running_jobs, 0,
          "jobs (and shards) of one tenant running at once, counted over every process on the store, unless its "
          "auth-file line sets max_running_jobs; its other queued jobs wait while the other tenants' run "
          "(0: no bound but the workers)");
ABSL_FLAG(int64_t, job_file_bytes, 0, "largest file a worker may write (0: twice --max_model_bytes)");
ABSL_FLAG(std::string, worker_user, "",
          "run workers as this user (the server must be root); empty: the server's user without capabilities");
ABSL_FLAG(int32_t, max_attempts, 3, "runs of a job the server died during, after which it fails");
ABSL_FLAG(std::vector<std::string>, extra_allowed_ops, {},
          "operators (ns::name, comma-separated) a model may use beyond the built-in allowlist");
ABSL_FLAG(int64_t, max_graph_nodes, 500000, "largest model graph accepted, in nodes (inlined forward)");
ABSL_FLAG(int64_t, keep_versions, 0,
          "retention: the newest versions of each model name a tenant keeps; older ones are deleted unless a "
          "queued or running job uses them (0: keep all; keep_versions= in --auth_file sets a tenant's)");
ABSL_FLAG(int64_t, keep_results_days, 0,
          "retention: days an ended job and its results are kept after it ended (0: forever; "
          "keep_results_days= in --auth_file sets a tenant's)");
ABSL_FLAG(double, upload_idle_seconds, 24 * 3600,
          "an unfinished model upload nobody appended to for this long is removed (its bytes count toward "
          "max_stored_bytes until then; 0: never)");
ABSL_FLAG(double, retention_interval_seconds, 600,
          "how often the retention sweeper runs (expired uploads, old versions and results; 0: never)");
ABSL_FLAG(int32_t, download_chunk_bytes, 1 << 20, "bytes per DownloadResult message");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "address to serve Prometheus metrics on at /metrics, loopback by default (0.0.0.0:9464 for a "
          "Prometheus in another container or host; port 0: any free port; empty: none)");
ABSL_FLAG(std::string, log_format, "text", "text | json (one object per line)");
ABSL_FLAG(std::string, log_level, "info", "debug | info | warning | error");

namespace {

// absl keeps only the last value of a repeated flag; --data_root accumulates.
recal::jobs::DataRoots AllDataRoots(int argc, char** argv) {
  recal::jobs::DataRoots roots;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    std::string value;
    if (absl::ConsumePrefix(&arg, "--data_root=")) {
      value = std::string(arg);
    } else if (arg == "--data_root" && i + 1 < argc) {
      value = argv[++i];
    } else {
      continue;
    }
    roots.Add(value);
  }
  return roots;
}

// --inspection_memory_total, or a quarter of the host's memory (MemTotal) but room for one
// inspection of `per_inspection` at least: what all inspecting workers together may hold, so
// that uploads cannot take the machine.
int64_t InspectionMemoryTotal(int64_t per_inspection) {
  if (absl::GetFlag(FLAGS_inspection_memory_total) > 0) return absl::GetFlag(FLAGS_inspection_memory_total);
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemTotal:") return std::max(kib * 1024 / 4, per_inspection);
    meminfo.ignore(64, '\n');
  }
  return 0;  // unknown: the count bound alone
}

int Fail(const absl::Status& status) {
  recal::log::Error(absl::StrCat("recal-server: ", status.message()));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  recal::ParseCommandLineOrExit(argc, argv, "recal-server",
                                "serves BatchNorm recalibration jobs over gRPC (recalctl, the C++ and Python clients)\n"
                                "  recal-server [--listen=127.0.0.1:50051] [--data_dir=./recal-data] [--data_root=DIR] "
                                "[options]");
  if (absl::Status configured = recal::log::Configure(absl::GetFlag(FLAGS_log_format), absl::GetFlag(FLAGS_log_level));
      !configured.ok()) {
    std::cerr << "recal-server: " << configured.message() << "\n";
    return 2;
  }

  // Signals are taken by one thread with sigwait, so block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const std::string role = absl::GetFlag(FLAGS_role);
  if (role != "all" && role != "api" && role != "worker") {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--role=", role, " is not all, api or worker")));
  }
  // Cluster mode's secret (docs/cluster.md). An api replica starts no recal-worker:
  // the worker processes inspect its uploads, and it reaches them with the secret.
  std::optional<recal::relay::RelaySecret> cluster_secret;
  if (role != "all" && !absl::GetFlag(FLAGS_internal_token_file).empty()) {
    auto secret = recal::relay::RelaySecret::FromFile(absl::GetFlag(FLAGS_internal_token_file));
    if (!secret.ok()) return Fail(secret.status());
    cluster_secret = *std::move(secret);
  } else if (role == "api") {
    return Fail(absl::FailedPreconditionError(
        "--role=api starts no recal-worker, so the worker processes inspect its uploads, reached with the "
        "cluster secret: give --internal_token_file=FILE, the same file as the workers' (at least 32 characters, "
        "e.g. a token from 'recalctl token new')"));
  }
  // Who may call, decided before anything listens.
  const std::string listen = absl::GetFlag(FLAGS_listen);
  std::unique_ptr<recal::auth::Authenticator> auth;
  if (!absl::GetFlag(FLAGS_auth_file).empty()) {
    auto loaded = recal::auth::Authenticator::FromFile(absl::GetFlag(FLAGS_auth_file));
    if (!loaded.ok()) return Fail(loaded.status());
    auth = *std::move(loaded);
  } else if (!recal::api::IsLoopbackAddress(listen) && !absl::GetFlag(FLAGS_allow_unauthenticated)) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "refusing to serve ", listen, " without credentials: anyone who reaches it could read every model and "
        "result. Give --auth_file=FILE (make a token with 'recalctl token new --tenant T --role submit'), "
        "listen on loopback (--listen=127.0.0.1:50051), or pass --allow_unauthenticated if the network is yours")));
  } else {
    auth = recal::auth::Authenticator::Open(recal::store::kDefaultTenant);
    if (!recal::api::IsLoopbackAddress(listen)) {
      recal::log::Warning(absl::StrCat("recal-server: serving ", listen,
                                       " WITHOUT authentication (--allow_unauthenticated): every caller is admin"));
    }
  }
  recal::api::TlsFiles tls{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                           absl::GetFlag(FLAGS_tls_client_ca)};
  auto credentials = recal::api::ServerCredentialsFor(tls);
  if (!credentials.ok()) return Fail(credentials.status());

  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  std::error_code error;
  std::filesystem::create_directories(data_dir, error);
  if (error) return Fail(absl::InternalError(absl::StrCat("cannot create ", data_dir, ": ", error.message())));
  auto opened_blobs = recal::store::OpenBlobStore(
      {.spec = absl::GetFlag(FLAGS_blobs),
       .data_dir = data_dir,
       .object_storage = [] { return recal::data::ObjectStorageOptions(recal::s3::S3SettingsFromFlags()); },
       .part_bytes = absl::GetFlag(FLAGS_blob_part_bytes)});
  if (!opened_blobs.ok()) return Fail(opened_blobs.status());
  // The endpoint may come up after the server: jobs fail UNAVAILABLE until it does.
  if (!opened_blobs->reachable.ok()) {
    recal::log::Warning(absl::StrCat("recal-server: blob store not reachable yet: ", opened_blobs->reachable.message()));
  }
  recal::store::BlobStore* blobs = opened_blobs->store.get();
  const std::string store_spec =
      absl::GetFlag(FLAGS_store).empty() ? "sqlite:" + data_dir + "/recal.db" : absl::GetFlag(FLAGS_store);
  auto metadata = recal::store::OpenMetadataStore(store_spec);
  if (!metadata.ok()) return Fail(metadata.status());
  recal::jobs::WorkerRunnerOptions worker;
  worker.binary = absl::GetFlag(FLAGS_worker_binary);
  if (worker.binary.empty()) {
    std::error_code error;
    worker.binary = (std::filesystem::read_symlink("/proc/self/exe", error).parent_path() / "recal-worker").string();
  }
  // An api process runs no jobs, so it has no devices to find. The others count CUDA devices
  // with recal-worker, which runs on them (this process loads no LibTorch), only for a
  // --devices that names CUDA.
  absl::StatusOr<std::vector<std::string>> devices = std::vector<std::string>();
  if (role != "api") {
    devices = recal::jobs::ResolveDevices(absl::GetFlag(FLAGS_devices), absl::GetFlag(FLAGS_cpu_workers),
                                          [&worker] { return recal::jobs::CountCudaDevices(worker.binary); });
  }
  if (!devices.ok()) return Fail(devices.status());

  // Metrics outlive everything that counts into them; null when --metrics_listen is empty.
  const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  std::unique_ptr<recal::metrics::Metrics> metrics;
  if (!metrics_listen.empty()) {
    metrics = std::make_unique<recal::metrics::Metrics>(role);
    for (const std::string& tenant : auth->Tenants()) metrics->AddTenant(tenant);
  }

  const recal::jobs::DataRoots data_roots = AllDataRoots(argc, argv);
  worker.scratch_root = blobs->scratch_dir();
  worker.data_roots = data_roots.All();
  // Data in a bucket: only where a data root names one, so that a server without any needs
  // no object-storage configuration. Read by this process for its sandboxed workers.
  if (std::any_of(worker.data_roots.begin(), worker.data_roots.end(),
                  [](const std::string& root) { return recal::data::IsS3Path(root); })) {
    auto settings = recal::data::ObjectStorageOptions(recal::s3::S3SettingsFromFlags());
    if (!settings.ok()) return Fail(settings.status());
    auto bucket = recal::data::ConnectBucket(*settings);
    if (!bucket.ok()) return Fail(bucket.status());
    worker.object_storage = *std::move(bucket);
  }
  worker.memory_bytes = absl::GetFlag(FLAGS_job_memory_bytes);
  worker.file_bytes = absl::GetFlag(FLAGS_job_file_bytes) > 0 ? absl::GetFlag(FLAGS_job_file_bytes)
                                                              : 2 * absl::GetFlag(FLAGS_max_model_bytes);
  worker.inspection_memory_bytes = absl::GetFlag(FLAGS_inspection_memory_bytes);
  worker.inspections = std::make_shared<recal::jobs::InspectionSlots>(recal::jobs::InspectionBounds{
      absl::GetFlag(FLAGS_max_concurrent_inspections), InspectionMemoryTotal(recal::jobs::InspectionMemoryBytes(worker)), 0,
      absl::Seconds(absl::GetFlag(FLAGS_inspection_wait_seconds))});
  worker.user = absl::GetFlag(FLAGS_worker_user);
  worker.extra_allowed_ops = absl::GetFlag(FLAGS_extra_allowed_ops);
  worker.max_graph_nodes = absl::GetFlag(FLAGS_max_graph_nodes);
  worker.threads = absl::GetFlag(FLAGS_threads_per_worker);
  worker.prefetch_depth = std::max(0, absl::GetFlag(FLAGS_prefetch_depth));
  worker.decode_threads = std::max(0, absl::GetFlag(FLAGS_decode_threads));
  recal::jobs::WorkerRunner runner(worker);
  if (role == "api") {
    recal::log::Info("recal-server: jobs and inspections of uploads run on the worker processes (--role=worker); "
                     "this process starts no recal-worker");
  } else {
    // Said once at start: what the sandbox holds on this machine, and by name what it cannot.
    auto sandbox = runner.DescribeSandbox();
    if (!sandbox.ok()) {
      return Fail(absl::Status(sandbox.status().code(),
                               absl::StrCat("the worker does not start: ", sandbox.status().message())));
    }
    recal::log::Info("recal-server: jobs run in sandboxed workers",
                     {{"worker", worker.binary}, {"enforced", absl::StrJoin(sandbox->enforced(), ", ")}});
    for (const std::string& missing : sandbox->missing()) {
      recal::log::Warning(absl::StrCat("recal-server: sandbox: not enforced on this machine: ", missing));
    }
  }
  // An api replica's connections to the workers' internal endpoints: the inspections of its
  // uploads, and the pushed batches of client-stream jobs.
  std::unique_ptr<recal::relay::RelayClient> relay_client;
  std::unique_ptr<recal::relay::RemoteInspector> remote_inspector;
  if (role == "api") {
    auto made = recal::relay::RelayClient::Make(*cluster_secret,
                                                {.tls_ca = absl::GetFlag(FLAGS_internal_tls_ca),
                                                 .tls_cert = tls.cert,
                                                 .tls_key = tls.key,
                                                 .max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes)});
    if (!made.ok()) return Fail(made.status());
    relay_client = *std::move(made);
    remote_inspector = std::make_unique<recal::relay::RemoteInspector>(relay_client.get(), metadata->get());
  }
  recal::jobs::ModelInspector* const inspector =
      remote_inspector ? static_cast<recal::jobs::ModelInspector*>(remote_inspector.get()) : &runner;
  const recal::jobs::TenantLimitsFn limits = [&auth](const std::string& tenant) {
    const recal::auth::TenantQuotas quotas = auth->QuotasOf(tenant);
    const auto or_flag = [](int64_t value, int64_t server_default) { return value > 0 ? value : server_default; };
    return recal::jobs::TenantLimits{
        quotas.max_active_jobs, quotas.max_stored_bytes, quotas.max_submissions_per_minute,
        or_flag(quotas.max_concurrent_inspections, absl::GetFlag(FLAGS_tenant_max_concurrent_inspections)),
        or_flag(quotas.max_running_jobs, absl::GetFlag(FLAGS_tenant_max_running_jobs))};
  };
  recal::jobs::ModelRegistry models(metadata->get(), blobs, absl::GetFlag(FLAGS_max_model_bytes), inspector,
                                    limits);
  models.SetInspectionWait(absl::Seconds(absl::GetFlag(FLAGS_inspection_wait_seconds)));
  // Cluster mode's client streams (docs/cluster.md, "Client streams across processes"): a worker process takes relayed
  // pushes on an internal endpoint of its own, an api replica relays them there; both only
  // with the cluster secret.
  std::unique_ptr<recal::relay::RelayService> relay_service;
  std::unique_ptr<recal::relay::InspectionService> inspection_service;
  recal::relay::InternalEndpoint internal;
  if (role == "worker" && cluster_secret) {
    relay_service = std::make_unique<recal::relay::RelayService>(*cluster_secret);
    inspection_service = std::make_unique<recal::relay::InspectionService>(
        *cluster_secret, &runner,
        recal::relay::InspectionServiceOptions{absl::GetFlag(FLAGS_max_model_bytes), worker.scratch_root});
    auto served = recal::relay::ServeInternal(
        absl::GetFlag(FLAGS_internal_listen), absl::GetFlag(FLAGS_advertise_address), *credentials,
        {relay_service.get(), inspection_service.get()}, absl::GetFlag(FLAGS_max_message_bytes));
    if (!served.ok()) return Fail(served.status());
    internal = *std::move(served);
    recal::log::Info("recal-server: internal endpoint for inspections and relayed pushes",
                     {{"listen", absl::GetFlag(FLAGS_internal_listen)}, {"advertised", internal.advertised}});
  } else if (role == "worker") {
    recal::log::Warning("recal-server: no --internal_token_file: api replicas cannot reach this worker, so it "
                        "inspects none of their uploads, and client-stream jobs it takes fail");
  }
  recal::jobs::JobManagerOptions options;
  // An api process runs no jobs; a process alone on an SQLite file (role all) may take back
  // every job left running at start, any other only those whose lease has run out.
  options.scheduler.devices = *devices;
  options.scheduler.lease = absl::Seconds(absl::GetFlag(FLAGS_lease_seconds));
  options.scheduler.recover_all_at_start = role == "all" && absl::StartsWith(store_spec, "sqlite:");
  options.client_streams = role == "all" || relay_client != nullptr;
  options.relay = relay_client.get();
  options.relay_wait = absl::Seconds(absl::GetFlag(FLAGS_relay_wait_seconds));
  if (role != "all") {
    options.scheduler.pushes = recal::jobs::SchedulerOptions::Pushes::kRelayed;
    options.scheduler.relay_endpoint = internal.advertised;
  }
  options.scheduler.max_queued_jobs = absl::GetFlag(FLAGS_max_queued_jobs);
  options.scheduler.data_roots = data_roots;
  options.scheduler.default_timeout_seconds = absl::GetFlag(FLAGS_job_timeout_seconds);
  options.scheduler.stream_idle = absl::Seconds(absl::GetFlag(FLAGS_stream_idle_seconds));
  options.max_batch_size = absl::GetFlag(FLAGS_max_batch_size);
  options.max_batch_bytes = absl::GetFlag(FLAGS_max_batch_bytes);
  options.scheduler.metrics = metrics.get();
  options.scheduler.max_attempts = std::max(1, absl::GetFlag(FLAGS_max_attempts));
  options.limits = limits;
  recal::jobs::JobManager jobs(metadata->get(), blobs, &models, &runner, options);
  if (relay_service) relay_service->Bind(&jobs);
  if (absl::Status started = jobs.Start(); !started.ok()) return Fail(started);
  // Api replicas send inspections to the workers they heard from lately.
  std::optional<recal::relay::EndpointHeartbeat> heartbeat;
  if (internal.server) {
    heartbeat.emplace(metadata->get(), jobs.lease_owner(), internal.advertised);
    heartbeat->Start();
  }

  // Every process that serves the API sweeps (with --blobs=s3:// each stages its own uploads);
  // what it does is safe when replicas do it at once (retention_sweeper.h).
  const recal::jobs::RetentionFn retention = [&auth](const std::string& tenant) {
    const recal::auth::TenantQuotas quotas = auth->QuotasOf(tenant);
    const auto or_default = [](int64_t value, int64_t server_default) {
      return value == recal::auth::kRetentionDefault ? server_default : value;
    };
    return recal::jobs::RetentionPolicy{or_default(quotas.keep_versions, absl::GetFlag(FLAGS_keep_versions)),
                                        or_default(quotas.keep_results_days, absl::GetFlag(FLAGS_keep_results_days))};
  };
  recal::jobs::RetentionSweeper sweeper(
      metadata->get(), blobs,
      {.retention = retention,
       .upload_idle = absl::Seconds(absl::GetFlag(FLAGS_upload_idle_seconds)),
       .interval = absl::Seconds(absl::GetFlag(FLAGS_retention_interval_seconds))});
  if (role != "worker" && absl::GetFlag(FLAGS_retention_interval_seconds) > 0) sweeper.Start();

  // Declared after `jobs`: it stops serving (its gauges read the jobs) before they go.
  std::unique_ptr<prometheus::Exposer> exposer;
  if (metrics) {
    std::vector<recal::metrics::ScrapedGauge> gauges = {
        {"recal_jobs_queued", "Jobs waiting for a worker", [&jobs] { return double(jobs.queued()); }},
        {"recal_jobs_running", "Jobs on a worker", [&jobs] { return double(jobs.running()); }},
        {"recal_inspections_running", "Upload inspections running on this host",
         [&worker] { return double(worker.inspections->running()); }},
        {"recal_inspections_queued", "Uploads waiting for an inspection slot (the host's or their tenant's)",
         [&worker, &models] {
           return double(worker.inspections->queued() + models.tenant_inspections().queued());
         }},
        {"recal_inspections_refused", "Uploads refused RESOURCE_EXHAUSTED for want of an inspection slot since start",
         [&worker, &models] {
           return double(worker.inspections->refused() + models.tenant_inspections().refused());
         }}};
    // Per tenant, as its quota counts: models and results as stored (whichever blob store),
    // and its unfinished uploads on this host's disk.
    recal::metrics::ScrapedGauge store_bytes{"recal_store_bytes",
                                             "Bytes a tenant stores: models, results and unfinished uploads"};
    store_bytes.label = "tenant";
    store_bytes.by_label = [&auth, &models] {
      std::map<std::string, double> bytes;
      for (const std::string& tenant : auth->Tenants()) {
        if (auto usage = models.Usage(tenant); usage.ok()) bytes[tenant] = static_cast<double>(usage->stored_bytes());
      }
      return bytes;
    };
    gauges.push_back(std::move(store_bytes));
    auto served = recal::metrics::Serve(metrics_listen, metrics.get(), std::move(gauges));
    if (!served.ok()) return Fail(served.status());
    exposer = *std::move(served);
    recal::log::Info(absl::StrCat("recal-server: metrics on port ", recal::metrics::PortOf(*exposer)),
                     {{"address", metrics_listen}, {"path", "/metrics"}});
  }

  recal::api::RecalService service(auth.get(), &models, &jobs,
                                   {.download_chunk_bytes = absl::GetFlag(FLAGS_download_chunk_bytes),
                                    .max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes)},
                                   metrics.get());
  grpc::EnableDefaultHealthCheckService(true);
  if (absl::GetFlag(FLAGS_reflection)) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, *credentials, &port);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_message_bytes));
  // A worker serves health (and metrics) only: clients talk to the api processes.
  if (role != "worker") builder.RegisterService(&service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<recal::metrics::ServerInterceptorFactory>(metrics.get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fail(absl::UnavailableError(absl::StrCat("cannot listen on ", listen)));
  }
  recal::log::Info(absl::StrCat("recal-server: listening on port ", port),
                   {{"address", listen},
                    {"auth", auth->enabled() ? auth->path() : "none (loopback)"},
                    {"tls", tls.cert.empty() ? "off" : tls.client_ca.empty() ? "on" : "mutual"},
                    {"data_dir", data_dir},
                    {"store", store_spec.substr(0, store_spec.find(':'))},  // never the URI: it may hold a password
                    {"blobs", blobs->Describe()},
                    {"role", role},
                    {"workers", static_cast<int64_t>(devices->size())},
                    {"version", recal::Version()}});

  // Health follows the store: a process that cannot reach it can neither take jobs nor
  // answer for them, so it says NOT_SERVING (a load balancer or Kubernetes routes around it).
  std::atomic<bool> stopping{false};
  std::mutex health_mu;
  std::condition_variable health_cv;
  std::thread store_health([&] {
    bool serving = true;
    std::unique_lock<std::mutex> lock(health_mu);
    while (!health_cv.wait_for(lock, std::chrono::seconds(2), [&] { return stopping.load(); })) {
      const absl::StatusOr<int64_t> reached = metadata->get()->CountJobsInStates({recal::v1::QUEUED});
      if (reached.ok() == serving) continue;
      serving = reached.ok();
      server->GetHealthCheckService()->SetServingStatus(serving);
      if (serving) {
        recal::log::Info("recal-server: the store answers again: SERVING");
      } else {
        recal::log::Error("recal-server: the store does not answer: NOT_SERVING",
                          {{"error", std::string(reached.status().message())}});
      }
    }
  });

  int signal = 0;
  while (sigwait(&signals, &signal) == 0 && signal == SIGHUP) {
    // A file that does not parse keeps the credentials in force.
    if (absl::Status reloaded = auth->Reload(); !reloaded.ok()) {
      recal::log::Error("recal-server: auth file not reloaded, the previous one stays",
                        {{"error", std::string(reloaded.message())}});
    } else {
      recal::log::Info("recal-server: auth file reloaded", {{"path", auth->path()}});
      if (metrics) {
        for (const std::string& tenant : auth->Tenants()) metrics->AddTenant(tenant);
      }
    }
  }
  recal::log::Info("recal-server: shutting down", {{"signal", signal}});
  {
    std::lock_guard<std::mutex> lock(health_mu);
    stopping = true;
  }
  health_cv.notify_all();
  store_health.join();
  const absl::Duration deadline = absl::Seconds(absl::GetFlag(FLAGS_shutdown_timeout_seconds));
  server->GetHealthCheckService()->SetServingStatus(false);
  if (heartbeat) heartbeat->Stop();  // no inspection is sent here any more
  sweeper.Stop();
  jobs.Shutdown(deadline);  // closes the feeds: relayed streams end
  if (internal.server) internal.server->Shutdown(std::chrono::system_clock::now() + absl::ToChronoSeconds(deadline));
  server->Shutdown(std::chrono::system_clock::now() + absl::ToChronoSeconds(deadline));
  exposer.reset();
  recal::log::Info("recal-server: stopped");
  return 0;
}
