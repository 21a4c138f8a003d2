// recal::Client: the C++ client of recal-server (proto/recal/v1/recal.proto).
//
//   auto client = recal::Client::Connect("localhost:50051", {});
//   if (!client.ok()) ...;
//   auto result = (*client)->Recalibrate("model.pt", "npy:calib/images.npy", {}, "out.pt");
//
// Every call returns an absl::Status (or StatusOr) carrying the server's gRPC code and
// message; nothing throws. Calls that are safe to repeat are retried on UNAVAILABLE with
// exponential backoff and jitter (ClientOptions::retry): Get*, List*, GetUploadStatus,
// CancelJob, and SubmitJob, which is made idempotent by a request_id the client generates.
// The streaming calls resume instead of starting over: an upload continues from the
// server's committed size, a download from the bytes already written, a watch from the
// last event seen, also across a server restart. They give up once the server has been
// unreachable for ClientOptions::reconnect_timeout.
//
// Thread-safe: one Client may serve calls from several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "recal/v1/recal.pb.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace recal {

// Waits between attempts of a call, and between reconnections of a stream. The channel's
// own reconnection backoff follows initial_backoff / max_backoff too, so that a restarted
// server is noticed within max_backoff.
struct RetryOptions {
  int max_attempts = 5;  // per unary call, the first included; 1 = no retries
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  double multiplier = 2.0;
  double jitter = 0.2;  // each wait is scaled by a random factor in [1 - jitter, 1 + jitter]
};

struct ClientOptions {
  // TLS: the PEM root certificates, given inline or as a file (the file wins). Both empty
  // and `tls` false: a plaintext channel (unless one of the options below asks for TLS).
  // `tls` alone: TLS with the system's roots. A TLS client turns off OpenSSL's cleanup at
  // exit (OPENSSL_INIT_NO_ATEXIT) unless the program initialised OpenSSL first: gRPC's
  // threads may still be connecting as the program exits.
  std::string tls_root_certs;
  std::string tls_root_certs_file;
  bool tls = false;
  // Mutual TLS: the client's PEM certificate (chain) and its private key, each inline or as
  // a file (one of the two, not both); the certificate and the key come together or not
  // at all. They imply TLS.
  std::string tls_client_cert;
  std::string tls_client_cert_file;
  std::string tls_client_key;
  std::string tls_client_key_file;
  // The name checked against the server's certificate instead of the target's host (for a
  // server reached by IP address or through a tunnel). Implies TLS.
  std::string tls_server_name;
  // Sent as "authorization: Bearer <token>" with every call when not empty.
  std::string bearer_token;
  // Each attempt of a unary call. Streams (upload, download, watch, push) have none.
  absl::Duration deadline = absl::Seconds(30);
  RetryOptions retry;
  // Streams resume while the server answers again within this long; the clock restarts
  // whenever a stream makes progress.
  absl::Duration reconnect_timeout = absl::Minutes(2);
  int64_t chunk_bytes = 1 << 20;             // upload chunk size (the server's limit is 8 MiB a message)
  int max_receive_message_bytes = 64 << 20;  // download chunks
};

// What UploadModel did.
struct UploadResult {
  v1::Model model;
  bool already_present = false;  // the server had these bytes: nothing (more) was sent
  int64_t bytes_sent = 0;        // over every attempt
  int64_t resumed_from = 0;      // the committed size the last attempt started at
};

struct DownloadResult {
  std::string path;
  int64_t size = 0;
  std::string sha256;  // verified against what the server announced
  int resumes = 0;     // broken streams picked up again
};

// Job events as WatchJob delivers them. Every (re)connection starts with a snapshot event
// whose seq is the last seq seen before; the other events arrive once each, in seq order.
using EventCallback = std::function<void(const v1::JobEvent&)>;

// Byte progress of an upload or download: done of total.
using TransferCallback = std::function<void(int64_t done, int64_t total)>;

// One batch's positional inputs for PushBatches; returns false once the data has ended.
using BatchProducer = std::function<absl::StatusOr<bool>(std::vector<v1::Tensor>* inputs)>;

// Everything Recalibrate reports while it works, phase by phase.
struct Progress {
  enum class Phase { kUpload, kPush, kJob, kDownload };
  Phase phase = Phase::kUpload;
  int64_t done = 0;                                  // bytes (upload, download) or batches pushed
  int64_t total = 0;                                 // 0 while unknown
  const v1::JobEvent* event = nullptr;               // kJob: the event (valid during the callback only)
  v1::Artifact artifact = v1::ARTIFACT_UNSPECIFIED;  // kDownload
  bool model_already_present = false;                // kUpload: the upload was skipped
};
using ProgressCallback = std::function<void(const Progress&)>;

struct RecalibrateOptions {
  // A model the server stores, as a reference ("rn50", "rn50:2", "sha256:<hex>", a digest
  // prefix): run it, upload nothing (the model path is then unused).
  std::string stored_model;
  std::string model_name;  // default: the model file's name
  std::map<std::string, std::string> model_labels;
  // The job: spec.model_id and spec.data are filled in by Recalibrate; batch_size 0 = 32.
  v1::JobSpec job;
  // true: the data spec names a LOCAL npy:/safetensors: file, pushed in batches of
  // job.batch_size through PushBatches; the server applies `stream_normalisation` (scale,
  // mean, std), or the spec's own ?scale=&mean=&std= (not both), to uint8 / float16 inputs.
  bool stream = false;
  v1::ClientStreamSource stream_normalisation;
  std::string bn_out;      // optional: also download the BatchNorm buffers (safetensors)
  // optional: also download the folded model (a PT2 archive); needs job.options().fold_batch_norm
  std::string folded_out;
  std::string report_out;  // optional: also download the report (JSON)
};

struct RecalibrateResult {
  UploadResult upload;
  v1::Job job;                            // SUCCEEDED
  std::vector<DownloadResult> downloads;  // model, then bn / folded / report when asked for
};

// A job that ended FAILED or CANCELLED comes back from Recalibrate as an error status
// (the job's own code and message) carrying the final Job; this returns it.
std::optional<v1::Job> JobOfError(const absl::Status& status);

// Whether an UNAVAILABLE status means that no server answered at the client's target at all
// (nothing listens there, a refused TLS handshake), rather than one that answered and is
// unavailable now (shutting down). A program can then say how to start one or where to
// point the client.
bool IsUnreachable(const absl::Status& status);

class Client {
 public:
  // Makes the channel; the server is contacted by the first call. INVALID_ARGUMENT for an
  // empty target, a client certificate without its key (or a key without its
  // certificate), or a certificate or key (inline or in a file) without PEM data;
  // NOT_FOUND / errno codes for an unreadable certificate or key file, naming the file.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target,
                                                         const ClientOptions& options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& target() const { return target_; }
  const ClientOptions& options() const { return options_; }

  // ---------------------------------------------------------------------------- models
  // Hashes the file, asks for model sha256:<hex> first (nothing is sent if the server has
  // it), else uploads it in chunks of options().chunk_bytes, resuming a broken upload from
  // the server's committed size. `name` defaults to the file's name.
  absl::StatusOr<UploadResult> UploadModel(const std::string& path, const std::string& name = "",
                                           const std::map<std::string, std::string>& labels = {},
                                           const TransferCallback& on_progress = nullptr);
  absl::StatusOr<v1::UploadStatus> GetUploadStatus(const std::string& sha256);
  absl::StatusOr<v1::Model> GetModel(const std::string& model_id);
  // Models take a reference wherever they are named: "sha256:<hex>", a unique digest prefix
  // (6+ hex digits), "name" (its latest version) or "name:version" (docs/models.md).
  // `name`: that name's versions only, newest first.
  absl::StatusOr<v1::ListModelsResponse> ListModels(int page_size = 0, const std::string& page_token = "",
                                                    const std::string& name = "");
  absl::StatusOr<v1::Model> DeleteModel(const std::string& model);  // the model deleted; not retried

  // ------------------------------------------------------------------------------ jobs
  // Submits with a fresh request_id (NewRequestId()), so retries never make two jobs.
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec);
  // The same with the caller's idempotency key: submitting it again returns the same job.
  absl::StatusOr<v1::Job> Submit(const v1::JobSpec& spec, const std::string& request_id);
  absl::StatusOr<v1::Job> Get(const std::string& job_id);
  absl::StatusOr<v1::ListJobsResponse> List(const std::vector<v1::JobState>& states = {}, int page_size = 0,
                                            const std::string& page_token = "");
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id);
  // Deletes an ended job with its results (FAILED_PRECONDITION while it is queued or running:
  // Cancel it first). Returns the job as it was and the bytes its results held. Not retried.
  absl::StatusOr<v1::DeleteJobResponse> DeleteJob(const std::string& job_id);

  // What the caller's tenant stores (models, results, unfinished uploads) against its quota.
  absl::StatusOr<v1::Usage> GetUsage();

  // Delivers the job's events after `after_seq` until its terminal state and returns the
  // final Job (whatever the state: check job.state()). Reconnects after a broken stream
  // or a server restart and resumes from the last seq seen.
  absl::StatusOr<v1::Job> Watch(const std::string& job_id, const EventCallback& on_event,
                                int64_t after_seq = 0);
  absl::StatusOr<v1::Job> Wait(const std::string& job_id) { return Watch(job_id, nullptr); }

  // Feeds a client_stream job; returns the number of batches the server took. Not
  // retried: a broken push cannot be resumed (the job fails for want of data and can be
  // submitted again). FAILED_PRECONDITION once the job no longer takes data. A sharded job
  // takes one stream per shard (JobSpec.shards), each ended by its own last message: the
  // streams may come from different processes (every rank of a torch.distributed job).
  // A batch larger than the server's message limit (GetServerInfo) is sent in parts that the
  // server joins into the same batch.
  absl::StatusOr<int64_t> PushBatches(const std::string& job_id, const BatchProducer& next, int shard = 0);

  // Writes a succeeded job's artifact to `path` atomically, resuming after a broken stream
  // from the bytes already received, and checks the sha256 the server sends (DATA_LOSS on
  // a mismatch; `path` is then left untouched).
  absl::StatusOr<DownloadResult> Download(const std::string& job_id, v1::Artifact artifact,
                                          const std::string& path,
                                          const TransferCallback& on_progress = nullptr);

  // grpc.health.v1 Check: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN".
  absl::StatusOr<std::string> Health(const std::string& service = "");
  // The server's version and size limits.
  absl::StatusOr<v1::ServerInfo> GetServerInfo();

  // ----------------------------------------------------------------------- all in one
  // Upload (or find) the model, submit, stream the local data if options.stream, watch,
  // and download the recalibrated model to `out_path` (plus bn_out / report_out).
  // `data` is a spec as recalctl takes it (recal/data.h: npy:, safetensors:, torch:,
  // synthetic:, images:); paths are the server's unless options.stream.
  absl::StatusOr<RecalibrateResult> Recalibrate(const std::string& model_path, absl::string_view data,
                                                const RecalibrateOptions& options,
                                                const std::string& out_path,
                                                const ProgressCallback& on_progress = nullptr);
  // The same with a typed server-side source (not client_stream: use the spec form).
  absl::StatusOr<RecalibrateResult> Recalibrate(const std::string& model_path, const v1::DataSource& data,
                                                const RecalibrateOptions& options,
                                                const std::string& out_path,
                                                const ProgressCallback& on_progress = nullptr);

  // A random 128-bit request id, as 32 lowercase hex characters.
  static std::string NewRequestId();

 private:
  struct Impl;
  Client(std::string target, ClientOptions options, std::unique_ptr<Impl> impl);

  absl::StatusOr<RecalibrateResult> Run(const std::string& model_path, const v1::DataSource& source,
                                        const std::string& local_spec, const RecalibrateOptions& options,
                                        const std::string& out_path, const ProgressCallback& on_progress);

  std::string target_;
  ClientOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace recal
