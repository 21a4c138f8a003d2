#include "server/worker/worker_task.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>

#include <ATen/ATen.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/data_source.h"
#include "common/status_macros.h"
#include "server/data/batch_source.h"
#include "server/data/normalization.h"
#include "server/data/torch_error.h"
#include "server/engine/folded_model.h"
#include "server/engine/recalibration.h"
#include "server/engine/report.h"
#include "server/worker/pushed_batches.h"
#include "server/worker/remote_objects.h"

namespace recal::worker {
namespace {

namespace api = ::recal::v1;

// The plan's options were checked at admission (server/jobs/job_plan.h); here they are only
// mapped.
engine::Options EngineOptionsOf(const v1::Task& task) {
  const v1::Recalibrate& job = task.recalibrate();
  const v1::EnginePlan& o = job.plan().engine();
  engine::Options options;
  if (o.estimator() != api::ESTIMATOR_UNSPECIFIED) options.estimator = o.estimator();
  if (o.modules() != api::MODULE_MODE_UNSPECIFIED) options.modules = o.modules();
  options.include = o.include();
  options.exclude = o.exclude();
  if (o.max_batches() > 0) options.max_batches = o.max_batches();
  options.allow_short_data = o.allow_short_data();
  options.target_rel_error = o.target_rel_error();
  if (o.iterations() > 0) options.iterations = o.iterations();
  options.device = job.device().empty() ? "cpu" : job.device();
  options.threads = job.threads();
  options.compute_dtype = engine::ComputeDtypeOf(o.compute_dtype());
  options.memory_format = engine::MemoryFormatOf(o.memory_format());
  return options;
}

engine::GraphPolicy GraphPolicyOf(const v1::Task& task) {
  engine::GraphPolicy policy;
  policy.extra_allowed_ops.assign(task.graph_policy().extra_allowed_ops().begin(),
                                  task.graph_policy().extra_allowed_ops().end());
  if (task.graph_policy().max_graph_nodes() > 0) policy.max_graph_nodes = task.graph_policy().max_graph_nodes();
  return policy;
}

v1::Event FailureEvent(const absl::Status& status) {
  v1::Event event;
  event.mutable_failure()->set_code(static_cast<int>(status.code()));
  event.mutable_failure()->set_message(std::string(status.message()));
  return event;
}

// The job's data: a shard's part of it (its batches, or its client's stream), or all of it.
struct OpenedData {
  std::unique_ptr<data::BatchSource> source;
  std::optional<int64_t> batches;  // a shard of a file or synthetic source: exactly these
};

absl::StatusOr<OpenedData> OpenData(const v1::Recalibrate& job, const TaskContext& context,
                                    const engine::Options& options, const EventSink& send) {
  const api::DataSource& data_source = job.plan().data();
  if (data_source.has_client_stream()) {
    const api::ClientStreamSource& stream = data_source.client_stream();
    if (context.input == nullptr) return absl::InternalError("no channel for pushed batches");
    std::unique_ptr<data::BatchSource> pushed = data::Normalized(
        PushedBatches(context.input),
        {stream.scale(), {stream.mean().begin(), stream.mean().end()}, {stream.std().begin(), stream.std().end()}});
    if (absl::StartsWith(job.device(), "cuda")) pushed = Pinned(std::move(pushed));
    return OpenedData{std::move(pushed), std::nullopt};
  }
  const std::optional<data::DataSpec> spec = data::DataSpecOfSource(data_source);
  if (!spec) return absl::InvalidArgumentError("the job's plan names no data source");
  data::InputOptions input;
  input.prefetch_depth = job.prefetch_depth();
  input.decode_threads = job.decode_threads();
  input.pin_memory = absl::StartsWith(job.device(), "cuda");
  input.access.data_roots.assign(job.data_roots().begin(), job.data_roots().end());
  if (job.has_remote_objects()) {
    if (context.input == nullptr) return absl::InternalError("no channel for reads of the job's data");
    input.access.object_storage = RemoteObjects(job.remote_objects(), context.input, send);
  }
  if (job.shard_count() > 1) {
    auto shard = data::OpenBatchSourceShard(
        *spec, job.plan().batch_size(), input,
        {job.shard_index(), job.shard_count(), options.max_batches.value_or(0), engine::kDefaultMaxBatches,
         options.allow_short_data});
    if (!shard.ok()) return shard.status();
    return OpenedData{std::move(shard->source), shard->range.count};
  }
  auto source = data::OpenBatchSource(*spec, job.plan().batch_size(), input);
  if (!source.ok()) return source.status();
  return OpenedData{*std::move(source), std::nullopt};
}

absl::Status WriteResults(const engine::Recalibration& run, const v1::EnginePlan& plan, api::RunReport report,
                          const TaskContext& context, const EventSink& send) {
  const std::filesystem::path scratch(context.scratch);
  absl::Status written = run.WriteModel((scratch / "model.pt").string());
  if (written.ok() && plan.fold_batch_norm()) {
    written = engine::WriteFoldedModel((scratch / "model.pt").string(), (scratch / "folded.pt2").string(), &report);
  }
  if (written.ok()) written = run.WriteBatchNormBuffers((scratch / "bn.safetensors").string());
  if (written.ok()) written = engine::WriteReportJson((scratch / "report.json").string(), report);
  if (!written.ok()) return written;
  v1::Event done;
  *done.mutable_report() = report;
  return send(done);
}

// What the report says of the job: its model, its data (as a spec, or "client stream") and
// its batch size.
void DescribeJob(const v1::JobPlan& plan, api::RunReport* report) {
  report->set_model(plan.model_id());
  const std::optional<data::DataSpec> spec = data::DataSpecOfSource(plan.data());
  report->set_data(spec ? data::DataSpecToString(*spec) : "client stream");
  report->set_batch_size(plan.batch_size());
}

// The merge of a sharded job: the shards' statistics into one result.
absl::Status Merge(const v1::Task& task, const TaskContext& context, const EventSink& send) {
  const v1::Recalibrate& job = task.recalibrate();
  engine::Options options = EngineOptionsOf(task);
  options.graph_policy = GraphPolicyOf(task);
  auto run = engine::Recalibration::Create(context.model, options);
  if (!run.ok()) return run.status();
  for (const std::string& name : job.merge()) {
    // Names, not paths: only files of the scratch directory.
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      return absl::InvalidArgumentError(absl::StrCat("bad statistics file name '", name, "'"));
    }
    auto shard = engine::ReadShardStatistics((std::filesystem::path(context.scratch) / name).string());
    if (!shard.ok()) return shard.status();
    if (absl::Status merged = (*run)->Merge(*shard); !merged.ok()) return merged;
  }
  if (absl::Status finished = (*run)->Finish(); !finished.ok()) return finished;
  api::RunReport report = (*run)->Report();
  DescribeJob(job.plan(), &report);
  report.set_shards(job.merge_size());
  return WriteResults(**run, job.plan().engine(), report, context, send);
}

absl::Status Recalibrate(const v1::Task& task, const TaskContext& context, const EventSink& send) {
  const v1::Recalibrate& job = task.recalibrate();
  if (job.merge_size() > 0) return Merge(task, context, send);
  const bool shard = job.shard_count() > 1;
  engine::Options options = EngineOptionsOf(task);
  options.graph_policy = GraphPolicyOf(task);
  auto data = OpenData(job, context, options, send);
  if (!data.ok()) return data.status();
  if (shard) {
    options = engine::ShardOptions(options, job.shard_count(),
                                   data->batches.value_or(options.max_batches.value_or(engine::kDefaultMaxBatches)));
    options.preload_output_copy = false;  // a shard hands over its statistics; the merge writes the model
  }
  auto run = engine::Recalibration::Create(context.model, options);
  if (!run.ok()) return run.status();
  std::vector<std::string> notes;
  data->source = data::CastToModelDtypes(std::move(data->source), (*run)->inputs(),
                                         [&](const std::string& note) { notes.push_back(note); });

  const std::optional<int64_t> total = data->source->num_samples();
  absl::Status sent;
  auto on_progress = [&](const engine::Progress& p) {
    v1::Event event;
    v1::Progress* progress = event.mutable_progress();
    progress->set_batches(p.batches);
    progress->set_samples(p.samples);
    progress->set_max_batches(p.max_batches);
    // A shard's own part: its batches are known, the data's samples say nothing of them.
    progress->set_total_samples(shard ? 0 : total.value_or(0));
    progress->set_seconds(p.seconds);
    progress->set_rel_std_error(p.rel_std_error);
    if (sent.ok()) sent = send(event);
  };
  // Each pass after the first (options.iterations) reads the data again from its start; the
  // plan never holds iterations > 1 for a client stream or a shard (job_plan.cc).
  int opened = 0;
  auto open_pass = [&]() -> absl::StatusOr<engine::NextBatchFn> {
    if (opened++ > 0) {
      auto again = OpenData(job, context, options, send);
      if (!again.ok()) return again.status();
      *data = *std::move(again);
      data->source = data::CastToModelDtypes(std::move(data->source), (*run)->inputs());  // noted once, above
    }
    return engine::NextBatchFn([&] { return data->source->Next(); });
  };
  absl::Status ran = shard ? (*run)->RunShard([&] { return data->source->Next(); }, on_progress)
                           : (*run)->RunPasses(open_pass, on_progress);
  if (!sent.ok()) return sent;
  if (!ran.ok()) return ran;

  api::RunReport report = (*run)->Report();
  DescribeJob(job.plan(), &report);
  report.set_skipped_files(data->source->skipped_files());
  report.mutable_notes()->Add(notes.begin(), notes.end());
  if (!shard) return WriteResults(**run, job.plan().engine(), report, context, send);
  const std::string path = (std::filesystem::path(context.scratch) / "statistics.safetensors").string();
  if (absl::Status written = engine::WriteShardStatistics(path, (*run)->Statistics()); !written.ok()) return written;
  v1::Event done;
  *done.mutable_report() = std::move(report);
  return send(done);
}

absl::Status Inspect(const v1::Task& task, const TaskContext& context, const EventSink& send) {
  auto inspection = engine::InspectModel(context.model, GraphPolicyOf(task));
  if (!inspection.ok()) return inspection.status();
  v1::Event event;
  *event.mutable_layers()->mutable_inputs() = inspection->inputs;
  for (const engine::DeclaredLayer& layer : inspection->layers) {
    api::BatchNormLayer* out = event.mutable_layers()->add_layers();
    out->set_name(layer.name);
    out->set_running_mean_key(layer.mean_key);
    out->set_running_var_key(layer.var_key);
    out->set_channels(layer.channels);
  }
  return send(event);
}

// ---------------------------------------------------------------- the sandbox, tried

void Attempt(v1::ProbeResult* result, const std::string& what, bool refused, const std::string& detail) {
  v1::ProbeAttempt* attempt = result->add_attempts();
  attempt->set_what(what);
  attempt->set_refused(refused);
  attempt->set_detail(detail);
}

std::string Outcome(int rc) { return rc < 0 ? std::strerror(errno) : "succeeded"; }

absl::Status Probe(const v1::SandboxProbe& probe, const TaskContext& context, const EventSink& send) {
  if (probe.crash()) {
    // Killed by the signal, as a crash is: not caught by a sanitizer's handler (which would
    // report it and exit 1 in an ASan build), nor by any other.
    ::signal(SIGSEGV, SIG_DFL);
    ::raise(SIGSEGV);
  }
  v1::Event event;
  v1::ProbeResult* result = event.mutable_probe();
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc = fd;
    if (fd >= 0) {
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_port = htons(static_cast<uint16_t>(probe.tcp_port()));
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      rc = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
      ::close(fd);
    }
    Attempt(result, absl::StrCat("connect to 127.0.0.1:", probe.tcp_port()), rc < 0, Outcome(rc));
  }
  {
    const int fd = ::open(probe.secret_path().c_str(), O_RDONLY | O_CLOEXEC);
    char byte;
    const int rc = fd < 0 ? -1 : static_cast<int>(::read(fd, &byte, 1));
    if (fd >= 0) ::close(fd);
    Attempt(result, "read " + probe.secret_path(), rc < 0, Outcome(rc));
  }
  {
    const int fd = ::open(probe.outside_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int rc = fd < 0 ? -1 : static_cast<int>(::write(fd, "x", 1));
    if (fd >= 0) ::close(fd);
    Attempt(result, "write " + probe.outside_path(), rc < 0, Outcome(rc));
  }
  {
    const std::string link = (std::filesystem::path(context.scratch) / "link").string();
    const int rc = ::symlink(probe.secret_path().c_str(), link.c_str());
    Attempt(result, "symlink in scratch to " + probe.secret_path(), rc < 0, Outcome(rc));
  }
  {
    char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
    char* const envp[] = {nullptr};
    const int rc = ::execve("/bin/true", argv, envp);  // returns only when refused
    Attempt(result, "execve /bin/true", rc < 0, Outcome(rc));
  }
  {
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(0);
    Attempt(result, "fork", pid < 0, Outcome(pid));
  }
  {
    const int rc = ::kill(probe.server_pid(), 0);
    Attempt(result, absl::StrCat("signal the server (pid ", probe.server_pid(), ")"), rc < 0, Outcome(rc));
  }
  {
    const int fd = ::open(std::filesystem::path(context.scratch).append("ok").c_str(),
                          O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int rc = fd < 0 ? -1 : static_cast<int>(::write(fd, "ok", 2));
    if (fd >= 0) ::close(fd);
    // The control: the one thing here that must work.
    Attempt(result, "write in scratch", rc < 0, Outcome(rc));
  }
  for (const std::string& library : probe.libraries()) {
    void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    const char* error = handle == nullptr ? ::dlerror() : nullptr;
    Attempt(result, "load " + library, handle == nullptr, error != nullptr ? error : "succeeded");
  }
  return send(event);
}

// A convolution and a batch norm in training mode on a small batch: LibTorch's allocator and
// its intra-op threads come up as for a job. Under too low an address-space limit this is
// where a worker fails (std::bad_alloc, or a crash), though loading LibTorch succeeded.
absl::Status SelfCheck(const EventSink& send) {
  try {
    const at::Tensor input = at::randn({8, 3, 32, 32});
    const at::Tensor features = at::conv2d(input, at::randn({16, 3, 3, 3}));
    const at::Tensor normalised = at::batch_norm(features, {}, {}, at::zeros({16}), at::ones({16}),
                                                 /*training=*/true, 0.1, 1e-5, /*cudnn_enabled=*/false);
    if (!std::isfinite(normalised.sum().item<double>())) {
      return absl::InternalError("LibTorch computed a non-finite batch norm of finite data");
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("LibTorch failed: ", data::ExceptionMessage(e)));
  }
  v1::Event event;
  event.mutable_self_checked();
  return send(event);
}

}  // namespace

absl::Status RunTask(const v1::Task& task, const TaskContext& context, const EventSink& send) {
  absl::Status send_failed;
  // Progress comes from the engine's thread, reads of data in a bucket from the decoding and
  // prefetching threads: one message at a time on the events pipe.
  std::mutex send_mu;
  const EventSink tracked = [&](const v1::Event& event) {
    std::lock_guard<std::mutex> lock(send_mu);
    absl::Status sent = send(event);
    if (!sent.ok() && send_failed.ok()) send_failed = sent;
    return sent;
  };
  absl::Status outcome;
  switch (task.kind_case()) {
    case v1::Task::kRecalibrate: outcome = Recalibrate(task, context, tracked); break;
    case v1::Task::kInspect: outcome = Inspect(task, context, tracked); break;
    case v1::Task::kSandboxProbe: outcome = Probe(task.sandbox_probe(), context, tracked); break;
    case v1::Task::kSelfCheck: outcome = SelfCheck(tracked); break;
    default: outcome = absl::InvalidArgumentError("an empty task");
  }
  if (!send_failed.ok()) return send_failed;
  if (outcome.ok()) return outcome;
  return send(FailureEvent(outcome));
}

}  // namespace recal::worker
