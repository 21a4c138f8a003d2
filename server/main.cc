// recal-server: the gRPC service, embedded by default (SQLite metadata and blobs under
// --data_dir). SIGTERM / SIGINT: health goes NOT_SERVING, workers stop at a batch
// boundary (their jobs stay QUEUED for the next start), watchers are ended, and the
// process exits within --shutdown_timeout_seconds. SIGHUP: the auth file is read again.
// This file parses the flags into app::ServerOptions; server/app/ builds and runs the server.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/command_line.h"
#include "server/app/server.h"
#include "server/app/server_options.h"
#include "server/jobs/resolved_data_source.h"
#include "server/log/log.h"
#include "server/s3/s3_flags.h"

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
ABSL_FLAG(int, store_connections, recal::store::kDefaultStoreConnections,
          "--store=postgresql://...: the connections this process opens to it at most; a call holds one for its "
          "transaction, so one waiting on a lock holds up no other while one is free");
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
ABSL_FLAG(int64_t, blob_cache_bytes, int64_t{16} << 30,
          "--blobs=s3://: what the models fetched for this host's jobs may take under DATA_DIR/s3-blobs/cache; the "
          "least recently used go first, never one a job is running (0: no bound)");
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
ABSL_FLAG(int64_t, job_memory_bytes, int64_t{16} << 30,
          "memory of each job's worker: its address space on the CPU (RLIMIT_AS), and what its memory cgroup "
          "lets it use (--worker_memory_cgroup); a GPU worker without a cgroup: its private memory (RLIMIT_DATA); "
          "0: no limit");
ABSL_FLAG(int64_t, inspection_memory_bytes, int64_t{4} << 30,
          "memory of each upload-inspecting worker, held as a job's, far below it; 0: --job_memory_bytes");
ABSL_FLAG(std::string, worker_memory_cgroup, "auto",
          "a cgroup per worker, limited to its memory cap, under the server's own cgroup (v2, else the v1 memory "
          "hierarchy): auto (where the kernel lets the server make them; said at start where not), required "
          "(refuse to start without), off");
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
ABSL_FLAG(int64_t, min_free_disk_bytes, int64_t{1} << 30,
          "free space kept on the disk uploads are staged on (the blob directory, or --data_dir with "
          "--blobs=s3://): upload bytes that would leave less are refused (RESOURCE_EXHAUSTED); 0: no floor");
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

// Who may call and where things live.
void ParseAccessAndStorageFlags(recal::app::ServerOptions& options) {
  options.listen = absl::GetFlag(FLAGS_listen);
  options.auth_file = absl::GetFlag(FLAGS_auth_file);
  options.allow_unauthenticated = absl::GetFlag(FLAGS_allow_unauthenticated);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.reflection = absl::GetFlag(FLAGS_reflection);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.store = absl::GetFlag(FLAGS_store);
  options.store_connections = absl::GetFlag(FLAGS_store_connections);
  options.blobs = absl::GetFlag(FLAGS_blobs);
  options.blob_part_bytes = absl::GetFlag(FLAGS_blob_part_bytes);
  options.blob_cache_bytes = absl::GetFlag(FLAGS_blob_cache_bytes);
  options.s3 = recal::s3::S3SettingsFromFlags();
  options.internal_token_file = absl::GetFlag(FLAGS_internal_token_file);
  options.internal_listen = absl::GetFlag(FLAGS_internal_listen);
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  options.internal_tls_ca = absl::GetFlag(FLAGS_internal_tls_ca);
  options.relay_wait = absl::Seconds(absl::GetFlag(FLAGS_relay_wait_seconds));
  options.lease = absl::Seconds(absl::GetFlag(FLAGS_lease_seconds));
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.shutdown_timeout = absl::Seconds(absl::GetFlag(FLAGS_shutdown_timeout_seconds));
}

// Workers, inspections, jobs and retention.
void ParseWorkFlags(recal::app::ServerOptions& options) {
  options.devices = absl::GetFlag(FLAGS_devices);
  options.cpu_workers = absl::GetFlag(FLAGS_cpu_workers);
  options.threads_per_worker = absl::GetFlag(FLAGS_threads_per_worker);
  options.prefetch_depth = absl::GetFlag(FLAGS_prefetch_depth);
  options.decode_threads = absl::GetFlag(FLAGS_decode_threads);
  options.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  options.job_memory_bytes = absl::GetFlag(FLAGS_job_memory_bytes);
  options.worker_memory_cgroup = absl::GetFlag(FLAGS_worker_memory_cgroup);
  options.job_file_bytes = absl::GetFlag(FLAGS_job_file_bytes);
  options.worker_user = absl::GetFlag(FLAGS_worker_user);
  options.extra_allowed_ops = absl::GetFlag(FLAGS_extra_allowed_ops);
  options.max_graph_nodes = absl::GetFlag(FLAGS_max_graph_nodes);
  options.inspection_memory_bytes = absl::GetFlag(FLAGS_inspection_memory_bytes);
  options.max_concurrent_inspections = absl::GetFlag(FLAGS_max_concurrent_inspections);
  options.inspection_memory_total = absl::GetFlag(FLAGS_inspection_memory_total);
  options.inspection_wait = absl::Seconds(absl::GetFlag(FLAGS_inspection_wait_seconds));
  options.tenant_max_concurrent_inspections = absl::GetFlag(FLAGS_tenant_max_concurrent_inspections);
  options.tenant_max_running_jobs = absl::GetFlag(FLAGS_tenant_max_running_jobs);
  options.max_queued_jobs = absl::GetFlag(FLAGS_max_queued_jobs);
  options.max_model_bytes = absl::GetFlag(FLAGS_max_model_bytes);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_batch_size = absl::GetFlag(FLAGS_max_batch_size);
  options.max_batch_bytes = absl::GetFlag(FLAGS_max_batch_bytes);
  options.job_timeout = absl::Seconds(absl::GetFlag(FLAGS_job_timeout_seconds));
  options.stream_idle = absl::Seconds(absl::GetFlag(FLAGS_stream_idle_seconds));
  options.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  options.download_chunk_bytes = absl::GetFlag(FLAGS_download_chunk_bytes);
  options.keep_versions = absl::GetFlag(FLAGS_keep_versions);
  options.keep_results_days = absl::GetFlag(FLAGS_keep_results_days);
  options.upload_idle = absl::Seconds(absl::GetFlag(FLAGS_upload_idle_seconds));
  options.retention_interval = absl::Seconds(absl::GetFlag(FLAGS_retention_interval_seconds));
  options.min_free_disk_bytes = absl::GetFlag(FLAGS_min_free_disk_bytes);
}

absl::StatusOr<recal::app::ServerOptions> OptionsFromFlags(int argc, char** argv) {
  recal::app::ServerOptions options;
  auto role = recal::app::ParseRole(absl::GetFlag(FLAGS_role));
  if (!role.ok()) return role.status();
  options.role = *role;
  ParseAccessAndStorageFlags(options);
  ParseWorkFlags(options);
  options.data_roots = AllDataRoots(argc, argv);
  return options;
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
  absl::StatusOr<recal::app::ServerOptions> options = OptionsFromFlags(argc, argv);
  if (!options.ok()) return Fail(options.status());
  if (absl::Status run = recal::app::RunServer(*std::move(options)); !run.ok()) return Fail(run);
  return 0;
}
