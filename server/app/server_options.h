// What recal-server is built from: every setting its flags give (server/main.cc), typed once
// at the flag edge. Field names follow the flags; their meaning and defaults are the flags'
// help texts (docs/server.md). Checks that need a file or the network (the cluster secret,
// the auth file, the store) are made by Server::BuildAndStart, with the flags' messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/jobs/resolved_data_source.h"
#include "server/s3/s3_config.h"
#include "server/store/metadata_store.h"

namespace recal::app {

// all: API and workers in one process; api: the API only (no recal-worker); worker: runs jobs
// only and serves health.
enum class Role { kAll, kApi, kWorker };

// "all" | "api" | "worker"; INVALID_ARGUMENT saying so for anything else.
absl::StatusOr<Role> ParseRole(absl::string_view name);
absl::string_view RoleName(Role role);

struct ServerOptions {
  Role role = Role::kAll;

  // Who may call, and how.
  std::string listen = "127.0.0.1:50051";  // port 0: any free port
  std::string auth_file;                   // empty: every caller is admin of "default"
  bool allow_unauthenticated = false;      // beyond loopback without auth_file
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  bool reflection = false;

  // Where things live.
  std::string data_dir = "./recal-data";
  std::string store;  // empty: sqlite:DATA_DIR/recal.db
  int store_connections = store::kDefaultStoreConnections;  // PostgreSQL's pool
  std::string blobs;  // empty: file:DATA_DIR
  int64_t blob_part_bytes = int64_t{64} << 20;
  int64_t blob_cache_bytes = int64_t{16} << 30;
  s3::S3Settings s3;  // object storage for s3:// blobs and data roots
  jobs::DataRoots data_roots;

  // Cluster mode (roles api and worker).
  std::string internal_token_file;  // role api requires it
  std::string internal_listen = "0.0.0.0:50052";
  std::string advertise_address;
  std::string internal_tls_ca;
  absl::Duration relay_wait = absl::Seconds(60);
  absl::Duration lease = absl::Seconds(30);

  // Workers and their sandbox.
  std::string devices = "cpu";  // cpu | auto | cuda:0,cuda:1 (jobs::ResolveDevices)
  int32_t cpu_workers = 1;
  int32_t threads_per_worker = 0;
  int32_t prefetch_depth = 2;
  int32_t decode_threads = 0;
  std::string worker_binary;  // empty: recal-worker beside this executable
  int64_t job_memory_bytes = int64_t{16} << 30;
  std::string worker_memory_cgroup = "auto";  // auto | required | off (worker_options.h)
  int64_t job_file_bytes = 0;  // 0: twice max_model_bytes
  std::string worker_user;
  std::vector<std::string> extra_allowed_ops;
  int64_t max_graph_nodes = 500000;

  // Upload inspections.
  int64_t inspection_memory_bytes = int64_t{4} << 30;
  int32_t max_concurrent_inspections = 4;
  int64_t inspection_memory_total = 0;  // 0: a quarter of MemTotal, at least one inspection's
  absl::Duration inspection_wait = absl::Seconds(120);
  int32_t tenant_max_concurrent_inspections = 2;
  int32_t tenant_max_running_jobs = 0;

  // Jobs and requests.
  int32_t max_queued_jobs = 64;
  int64_t max_model_bytes = int64_t{2} << 30;
  int32_t max_message_bytes = 8 << 20;
  int64_t max_batch_size = 4096;
  int64_t max_batch_bytes = int64_t{256} << 20;
  absl::Duration job_timeout = absl::Hours(6);
  absl::Duration stream_idle = absl::Seconds(300);
  int32_t max_attempts = 3;
  int32_t download_chunk_bytes = 1 << 20;

  // Retention.
  int64_t keep_versions = 0;
  int64_t keep_results_days = 0;
  absl::Duration upload_idle = absl::Hours(24);
  absl::Duration retention_interval = absl::Seconds(600);  // <= 0: never
  // Free space kept on the disk uploads are staged on (store::DiskFloor); 0: none.
  int64_t min_free_disk_bytes = int64_t{1} << 30;

  std::string metrics_listen = "127.0.0.1:9464";  // empty: no metrics endpoint
  absl::Duration shutdown_timeout = absl::Seconds(20);
};

}  // namespace recal::app
