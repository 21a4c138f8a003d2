// recalctl: the command line client of recal-server.
//
// Exit codes (exit_codes.h; also printed by --help):
//   0 succeeded, 1 other error, 2 bad usage, 3 server unreachable, 4 not found,
//   5 job failed, 6 job cancelled.
// stdout holds the result only (one JSON document with --output=json); errors and
// progress go to stderr.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/recalctl/args.h"
#include "client/recalctl/commands.h"
#include "client/recalctl/exit_codes.h"
#include "client/recalctl/progress.h"
#include "common/nearest_name.h"
#include "common/version.h"
#include "recal/client.h"

namespace recal::ctl {
namespace {

constexpr char kUsage[] = R"(recalctl: recalibrate BatchNorm statistics with recal-server

Usage: recalctl COMMAND [ARGS] [FLAGS]

Commands:
  upload MODEL [--name N] [--label K=V]...      upload a model: TorchScript (.pt) or a
                                                torch.export program (.pt2) (skipped if the
                                                server has these bytes; resumes a broken upload);
                                                new bytes under a name (default: the file's)
                                                are its next version
  submit --model REF --data SPEC [JOB FLAGS]    submit a job; prints it. REF: name, name:version,
                                                sha256:<hex> or a digest prefix (6+ hex digits)
  get JOB                                       a job's state (why it waits, if queued),
                                                progress and error
  list [--state S]... [--models] [--name N] [--page_size N] [--page_token T]
                                                jobs; --models: models, newest first;
                                                --name N: that model's versions
  delete JOB | REF [--model]                    delete an ended job and its results (refused
                                                while queued or running: cancel it first), or
                                                a model (refused while a job uses it). JOB:
                                                job-<16 hex>; --model: REF is a model even so
  usage                                         what your tenant stores (models, results,
                                                unfinished uploads) against its quota
  watch JOB [--after_seq N]                     follow a job to its end (reconnects); prints it
  cancel JOB                                    cancel a queued or running job
  download JOB -o PATH [--artifact model|bn|report|folded]
                                                a succeeded job's result (resumes; sha256 checked)
  run MODEL --data SPEC -o OUT [--bn_out F.safetensors] [--folded_out F.pt2] [--report R.json] [--name N]
      [JOB FLAGS]                               upload, submit, watch and download in one go;
                                                MODEL: a file, or a stored model's REF (as
                                                submit takes it: nothing is uploaded)
  report JOB [--top N | --all] [--warn_rel_error E] [--html PAGE.html]
  report --from REPORT.json [...]                a succeeded job's per-layer report as a table:
                                                the run's facts, then the N (15) layers whose
                                                mean moved most, with flags for rows worth a
                                                look (unused, rel.err above E (0.05), zero-
                                                variance channels); --html also writes one
                                                self-contained page with plots across depth
                                                instead (its path on stdout);
                                                --output=json prints the RunReport
  health [--service NAME]                       grpc.health.v1 Check; exit 0 only if SERVING
  token new --tenant T --role read|submit|admin
                                                no server needed: prints a new bearer token
                                                (recal_ + 64 hex digits) and, on a second line,
                                                the line granting it in the server's --auth_file:
                                                token-sha256:<sha256 of the token> tenant=T role=R
                                                (T: 1 to 64 of A-Z a-z 0-9 _ . -)

Job flags (submit, run):
  --batch_size N (32)  --max_batches N  --estimator population|batch_average
  --modules eval|train|as_saved  --include RE  --exclude RE  --target_rel_error E
  --allow_short_data  --priority N  --timeout SECONDS  --label K=V
  --compute_dtype float32|bfloat16|float16   the forward's precision (autocast);
                       statistics stay float64  --memory_format
                       auto|contiguous|channels_last
  --iterations K       K passes over the data, each with the statistics of the one before
                       (quantization-aware Conv-BN reads them); not with --stream or --shards
  --fold_batch_norm    also make the folded model (artifact folded; torch.export programs):
                       each BatchNorm after a convolution or linear layer folded into it
  --shards K           run as K shards on any workers, merged exactly; with --stream,
                       the local batches are pushed by K concurrent streams, one per shard
  --stream             SPEC names a LOCAL npy:/safetensors: file (float32, float16, uint8),
                       sent in --batch_size batches through PushBatches
  --scale S --mean A,B,C --std A,B,C   server-side normalisation of streamed data (or
                       the spec's ?NORM)
  --request_id ID      (submit) idempotency key; default: a random one

Data SPEC (paths are the server's, relative to its --data_root or absolute):
  npy:PATH[?NORM]  safetensors:PATH[:KEY,KEY...][?NORM]  torch:PATH[?NORM]
      NORM = scale=S&mean=M,..&std=S,..: uint8/float16 inputs become (x / S - mean) / std
  synthetic:SHAPE[,seed=S]
  images:DIR[?resize=R&crop=C&mean=M,M,M&std=S,S,S&samples=N&shuffle=0|1&seed=S&on_bad=fail|skip]
      every .jpg/.jpeg/.png under DIR through torchvision's Resize(R), CenterCrop(C),
      ToTensor, Normalize(mean, std); sorted (or shuffled with seed S), the first N;
      on_bad=skip skips unreadable files instead of failing the job
  A PATH containing '?' needs a trailing '?' (npy:/d/what?.npy?).

Global flags:
  --server HOST:PORT   (env RECAL_SERVER; default localhost:50051)
  --token TOKEN        bearer token (env RECAL_TOKEN)
  --tls                use TLS (with the system's root certificates unless --tls_ca)
  --tls_ca FILE        PEM root certificates that the server's must chain to (env
                       RECAL_TLS_CA; implies --tls)
  --tls_cert FILE      PEM client certificate, for servers that ask for one (mutual TLS;
                       env RECAL_TLS_CERT; implies --tls; needs --tls_key)
  --tls_key FILE       the client certificate's PEM private key (env RECAL_TLS_KEY)
  --tls_server_name NAME
                       the name the server's certificate must carry when it is not the host
                       of --server (e.g. a server reached by IP address); implies --tls
  --output text|json   json: the response as one protobuf JSON document on stdout
  --deadline SECONDS   per call (default 30)
  -q, --quiet          no progress on stderr
  -h, --help
  --version            recalctl's version (and the server's, when one answers at --server)

Exit codes:
  0 succeeded   1 other error   2 bad usage   3 server unreachable   4 not found
  5 job failed  6 job cancelled
On an error stdout stays empty (the reason goes to stderr), except that run and watch
print the failed or cancelled job.
)";

struct CommandEntry {
  const char* name;
  int (*run)(Context&);
};

// Commands that need no server: they run without connecting.
struct LocalCommandEntry {
  const char* name;
  int (*run)(const Args&, bool json, bool quiet);
};

constexpr LocalCommandEntry kLocalCommands[] = {{"token", Token}};

constexpr CommandEntry kCommands[] = {
    {"upload", Upload}, {"submit", Submit},     {"get", Get}, {"list", List},     {"watch", Watch},
    {"cancel", Cancel}, {"download", Download}, {"run", Run}, {"health", Health}, {"report", Report},
    {"delete", Delete}, {"usage", Usage},
};

// recalctl's version, and the server's when one answers: a client and a server of different
// versions are the first thing to rule out.
int Version(Context& ctx) {
  std::printf("recalctl %s (no LibTorch: the server runs the models)\n", recal::Version());
  absl::StatusOr<v1::ServerInfo> server = ctx.client.GetServerInfo();
  if (server.ok()) {
    std::printf("recal-server %s (LibTorch %s)\n", server->version().c_str(), server->libtorch_version().c_str());
  } else {
    std::printf("recal-server: %s\n", std::string(server.status().message()).c_str());
  }
  return kOk;
}

std::string Env(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

int Main(int argc, char** argv) {
  auto args = Args::Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (!args.ok()) return UsageError(args.status());
  if (args->GetBool("help") || args->command() == "help") {
    std::fputs(kUsage, stdout);
    return kOk;
  }
  static constexpr CommandEntry kVersion = {"version", Version};
  const bool version = args->GetBool("version");
  if (args->command().empty() && !version) return UsageError(absl::InvalidArgumentError("no command given"));
  const CommandEntry* command = version ? &kVersion : nullptr;
  for (const CommandEntry& entry : kCommands) {
    if (args->command() == entry.name && !version) command = &entry;
  }
  const LocalCommandEntry* local = nullptr;
  for (const LocalCommandEntry& entry : kLocalCommands) {
    if (args->command() == entry.name) local = &entry;
  }
  // A report file on disk needs no server: no connection, so no server or TLS settings matter.
  static constexpr LocalCommandEntry kReportFromFile = {"report", ReportFromFile};
  if (args->command() == "report" && args->Has("from") && !version) local = &kReportFromFile;
  if (command == nullptr && local == nullptr) {
    std::vector<std::string> names;
    for (const CommandEntry& entry : kCommands) names.emplace_back(entry.name);
    for (const LocalCommandEntry& entry : kLocalCommands) names.emplace_back(entry.name);
    return UsageError(absl::InvalidArgumentError(
        absl::StrCat("unknown command '", args->command(), "'", DidYouMean(args->command(), names))));
  }
  const std::string output = args->Get("output", "text");
  if (output != "text" && output != "json") {
    return UsageError(absl::InvalidArgumentError("--output must be text or json"));
  }
  if (local != nullptr) return local->run(*args, output == "json", args->GetBool("quiet"));
  // --version asks the server too, but must not wait long for one that is not there.
  auto deadline = args->GetDouble("deadline", version ? 3 : 30);
  if (!deadline.ok() || *deadline <= 0) {
    return UsageError(absl::InvalidArgumentError("--deadline must be a positive number of seconds"));
  }

  ClientOptions options;
  options.bearer_token = args->Get("token", Env("RECAL_TOKEN", ""));
  const std::string server = args->Get("server", Env("RECAL_SERVER", "localhost:50051"));
  // Where each came from, for the hints of error messages (commands.h).
  const std::string server_from = args->Has("server") ? "--server" : Env("RECAL_SERVER", "").empty() ? "" : "RECAL_SERVER";
  const std::string token_from = options.bearer_token.empty() ? "" : args->Has("token") ? "--token" : "RECAL_TOKEN";
  SetConnectionFacts({server, server_from, token_from});
  options.tls_root_certs_file = args->Get("tls_ca", Env("RECAL_TLS_CA", ""));
  options.tls_client_cert_file = args->Get("tls_cert", Env("RECAL_TLS_CERT", ""));
  options.tls_client_key_file = args->Get("tls_key", Env("RECAL_TLS_KEY", ""));
  options.tls_server_name = args->Get("tls_server_name");
  options.tls = args->GetBool("tls");
  // Caught here to name the flags; the library names its options.
  if (options.tls_client_cert_file.empty() != options.tls_client_key_file.empty()) {
    return UsageError(absl::InvalidArgumentError(options.tls_client_key_file.empty()
                                                     ? "--tls_cert needs --tls_key (or RECAL_TLS_KEY)"
                                                     : "--tls_key needs --tls_cert (or RECAL_TLS_CERT)"));
  }
  options.deadline = absl::Seconds(*deadline);
  auto client = Client::Connect(server, options);
  // A TLS setting that cannot work (a certificate without its key, a file that is not PEM)
  // is the user's to fix, as any other bad flag; an unreadable file keeps its own code.
  if (!client.ok()) {
    return client.status().code() == absl::StatusCode::kInvalidArgument ? UsageError(client.status())
                                                                         : Fail(client.status());
  }

  ProgressDisplay progress(!args->GetBool("quiet"), ::isatty(STDERR_FILENO) == 1);
  Context ctx{*args, output == "json", **client, progress};
  return command->run(ctx);
}

}  // namespace

int ExitCodeForJob(const v1::Job& job) {
  switch (job.state()) {
    case v1::SUCCEEDED:
      return kOk;
    case v1::FAILED:
      return kJobFailed;
    case v1::CANCELLED:
      return kJobCancelled;
    default:
      return kError;
  }
}

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return kOk;
  if (std::optional<v1::Job> job = JobOfError(status)) return ExitCodeForJob(*job);
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kUnreachable;
    case absl::StatusCode::kNotFound:
      return kNotFound;
    default:
      return kError;
  }
}

}  // namespace recal::ctl

int main(int argc, char** argv) { return recal::ctl::Main(argc, argv); }
