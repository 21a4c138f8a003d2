// submit and run: the commands that build a job spec from flags.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/recalctl/commands.h"
#include "client/recalctl/exit_codes.h"
#include "client/recalctl/output.h"
#include "common/enum_names.h"
#include "common/request_limits.h"
#include "common/status_macros.h"
#include "recal/data.h"

namespace recal::ctl {
namespace {

// Flags both submit and run take.
// clang-format off
const std::vector<std::string> kJobFlags = {
    "data", "stream", "batch_size", "max_batches", "estimator", "modules", "include", "exclude",
    "target_rel_error", "allow_short_data", "priority", "timeout", "label", "scale", "mean", "std", "shards",
    "compute_dtype", "memory_format", "iterations", "fold_batch_norm"};
// clang-format on

std::vector<std::string> With(std::vector<std::string> flags, std::initializer_list<const char*> more) {
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

absl::StatusOr<std::vector<float>> ParseFloats(const std::string& name, const std::string& text) {
  std::vector<float> values;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    float value = 0;
    if (!absl::SimpleAtof(part, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " takes numbers separated by ',', not '", text, "'"));
    }
    values.push_back(value);
  }
  return values;
}

// The job spec the flags describe (all but model_id and data). INVALID_ARGUMENT: usage.
absl::Status FillSpec(const Args& args, v1::JobSpec* spec, v1::ClientStreamSource* normalisation) {
  RECAL_ASSIGN_OR_RETURN(const int64_t batch_size, args.GetInt("batch_size", 32));
  RECAL_ASSIGN_OR_RETURN(const int64_t max_batches, args.GetInt("max_batches", 0));
  RECAL_ASSIGN_OR_RETURN(const int64_t priority, args.GetInt("priority", 0));
  RECAL_ASSIGN_OR_RETURN(const double timeout, args.GetDouble("timeout", 0));
  RECAL_ASSIGN_OR_RETURN(const double target, args.GetDouble("target_rel_error", 0));
  RECAL_ASSIGN_OR_RETURN(const int64_t shards, args.GetInt("shards", 1));
  RECAL_ASSIGN_OR_RETURN(const int64_t iterations, args.GetInt("iterations", 1));
  if (iterations < 1 || iterations > limits::kMaxIterations) {
    return absl::InvalidArgumentError(absl::StrCat("--iterations must be 1 to ", limits::kMaxIterations));
  }
  if (shards < 1) return absl::InvalidArgumentError("--shards must be at least 1");
  if (shards > 1) spec->set_shards(static_cast<int32_t>(shards));
  if (batch_size < 1) return absl::InvalidArgumentError("--batch_size must be at least 1");
  if (max_batches < 0 || timeout < 0 || target < 0) {
    return absl::InvalidArgumentError("--max_batches, --timeout and --target_rel_error cannot be negative");
  }
  spec->set_batch_size(batch_size);
  spec->set_priority(static_cast<int32_t>(priority));
  spec->set_timeout_seconds(timeout);
  v1::EngineOptions* options = spec->mutable_options();
  options->set_max_batches(max_batches);
  options->set_target_rel_error(target);
  if (iterations > 1) options->set_iterations(static_cast<int32_t>(iterations));
  options->set_allow_short_data(args.GetBool("allow_short_data"));
  options->set_fold_batch_norm(args.GetBool("fold_batch_norm"));
  options->set_include(args.Get("include"));
  options->set_exclude(args.Get("exclude"));
  // Checked by the server against the same proto enums (v1::ComputeDtype, v1::MemoryFormat).
  options->set_compute_dtype(args.Get("compute_dtype"));
  options->set_memory_format(args.Get("memory_format"));
  if (args.Has("estimator")) {
    const auto estimator = EnumFromName<v1::Estimator>(absl::AsciiStrToLower(args.Get("estimator")));
    if (!estimator) {
      return absl::InvalidArgumentError(absl::StrCat("--estimator must be ", EnumNameList<v1::Estimator>()));
    }
    options->set_estimator(*estimator);
  }
  if (args.Has("modules")) {
    const auto modules = EnumFromName<v1::ModuleMode>(absl::AsciiStrToLower(args.Get("modules")));
    if (!modules) {
      return absl::InvalidArgumentError(absl::StrCat("--modules must be ", EnumNameList<v1::ModuleMode>()));
    }
    options->set_modules(*modules);
  }
  RECAL_ASSIGN_OR_RETURN(const auto labels, args.GetPairs("label"));
  spec->mutable_labels()->insert(labels.begin(), labels.end());

  const bool normalises = args.Has("scale") || args.Has("mean") || args.Has("std");
  if (normalises && !args.GetBool("stream")) {
    return absl::InvalidArgumentError("--scale, --mean and --std apply to --stream data only");
  }
  RECAL_ASSIGN_OR_RETURN(const double scale, args.GetDouble("scale", 0));
  normalisation->set_scale(static_cast<float>(scale));
  if (args.Has("mean")) {
    RECAL_ASSIGN_OR_RETURN(const auto mean, ParseFloats("mean", args.Get("mean")));
    normalisation->mutable_mean()->Add(mean.begin(), mean.end());
  }
  if (args.Has("std")) {
    RECAL_ASSIGN_OR_RETURN(const auto std, ParseFloats("std", args.Get("std")));
    normalisation->mutable_std()->Add(std.begin(), std.end());
  }
  if (!args.Has("data")) return absl::InvalidArgumentError("--data SPEC is required");
  return absl::OkStatus();
}

// A usage error for what the user typed, another exit code for what the world did.
int Failed(const absl::Status& status, bool usage) { return usage ? UsageError(status) : Fail(status); }

// Local data can be wrong in two ways: a malformed spec (usage) or a bad file (error).
absl::StatusOr<std::unique_ptr<LocalBatches>> OpenLocal(const std::string& spec, int64_t batch_size,
                                                        bool* usage) {
  auto source = DataSourceFromSpec(spec);
  *usage = !source.ok() || !source->has_tensor_file() ||
           source->tensor_file().format() == v1::TensorFileSource::TORCH;
  return LocalBatches::Open(spec, batch_size);
}

void ShowProgress(ProgressDisplay& display, const std::string& model_path, const Progress& p) {
  switch (p.phase) {
    case Progress::Phase::kUpload:
      if (p.model_already_present) {
        display.Line(absl::StrCat("model ", model_path, " is on the server already; upload skipped"));
      } else {
        display.Transfer("upload " + model_path, p.done, p.total);
      }
      break;
    case Progress::Phase::kPush:
      display.Transfer("push", p.done, p.total, "batches");
      break;
    case Progress::Phase::kJob:
      if (p.event != nullptr) display.Event(*p.event);
      break;
    case Progress::Phase::kDownload:
      display.Transfer(absl::StrCat("download ", absl::AsciiStrToLower(v1::Artifact_Name(p.artifact))),
                       p.done, p.total);
      break;
  }
}

}  // namespace

int Submit(Context& ctx) {
  if (auto s = ctx.args.AllowOnly(With(kJobFlags, {"model", "request_id"})); !s.ok()) return UsageError(s);
  if (auto s = ctx.args.ExpectPositional(0, "no arguments (the model is --model ID)"); !s.ok()) {
    return UsageError(s);
  }
  v1::JobSpec spec;
  v1::ClientStreamSource normalisation;
  if (auto s = FillSpec(ctx.args, &spec, &normalisation); !s.ok()) return UsageError(s);
  if (!ctx.args.Has("model")) return UsageError(absl::InvalidArgumentError("--model ID is required"));
  spec.set_model_id(ctx.args.Get("model"));
  const std::string data = ctx.args.Get("data");
  const std::string request_id = ctx.args.Get("request_id", Client::NewRequestId());
  const bool stream = ctx.args.GetBool("stream");

  std::unique_ptr<LocalBatches> batches;
  if (stream) {
    auto source = StreamSourceFromSpec(data, normalisation);
    if (!source.ok()) return UsageError(source.status());
    *spec.mutable_data() = *std::move(source);
    bool usage = false;
    auto opened = OpenLocal(data, spec.batch_size(), &usage);
    if (!opened.ok()) return Failed(opened.status(), usage);
    batches = *std::move(opened);
  } else {
    auto source = DataSourceFromSpec(data);
    if (!source.ok()) return UsageError(source.status());
    *spec.mutable_data() = *source;
  }
  auto job = ctx.client.Submit(spec, request_id);
  if (!job.ok()) return Fail(job.status());

  if (batches) {
    const int64_t max = spec.options().max_batches();
    const int64_t total = max > 0 ? std::min(max, batches->num_batches()) : batches->num_batches();
    const int shards = std::max(1, spec.shards());
    // Shard k pushes the k-th contiguous run of the batches, as the server splits files.
    std::vector<std::unique_ptr<LocalBatches>> readers;
    readers.push_back(std::move(batches));
    for (int k = 1; k < shards; ++k) {
      bool usage = false;
      auto opened = OpenLocal(data, spec.batch_size(), &usage);
      if (!opened.ok()) return Failed(opened.status(), usage);
      readers.push_back(*std::move(opened));
    }
    std::mutex mu;
    int64_t pushed = 0;
    std::vector<absl::Status> results(shards);
    std::vector<std::thread> pushers;
    for (int k = 0; k < shards; ++k) {
      pushers.emplace_back([&, k] {
        const int64_t first = total * k / shards, end = total * (k + 1) / shards;
        std::vector<v1::Tensor> skipped;
        for (int64_t i = 0; i < first; ++i) {
          auto more = readers[k]->Next(&skipped);
          if (!more.ok()) {
            results[k] = more.status();
            return;
          }
        }
        int64_t mine = first;
        auto sent = ctx.client.PushBatches(
            job->id(),
            [&](std::vector<v1::Tensor>* inputs) -> absl::StatusOr<bool> {
              if (mine >= end) return false;
              RECAL_ASSIGN_OR_RETURN(const bool more, readers[k]->Next(inputs));
              if (more) {
                ++mine;
                std::lock_guard<std::mutex> lock(mu);
                ctx.progress.Transfer("push", ++pushed, total, "batches");
              }
              return more;
            },
            k);
        results[k] = sent.status();
      });
    }
    for (std::thread& pusher : pushers) pusher.join();
    for (const absl::Status& sent : results) {
      // FAILED_PRECONDITION: the job takes no more data; its state says how it went.
      if (!sent.ok() && sent.code() != absl::StatusCode::kFailedPrecondition) {
        ctx.client.Cancel(job->id()).IgnoreError();
        return Fail(sent);
      }
    }
    job = ctx.client.Get(job->id());
    if (!job.ok()) return Fail(job.status());
  }
  Emit(ctx, *job, JobText(*job));
  return kOk;
}

int Run(Context& ctx) {
  if (auto s = ctx.args.AllowOnly(With(kJobFlags, {"out", "bn_out", "folded_out", "report", "name"})); !s.ok()) {
    return UsageError(s);
  }
  if (auto s = ctx.args.ExpectPositional(1, "one model file or stored model (name, name:version or digest)");
      !s.ok()) {
    return UsageError(s);
  }
  RecalibrateOptions options;
  if (auto s = FillSpec(ctx.args, &options.job, &options.stream_normalisation); !s.ok()) return UsageError(s);
  if (!ctx.args.Has("out")) return UsageError(absl::InvalidArgumentError("'run' needs -o OUT (where the recalibrated model goes)"));
  const std::string data = ctx.args.Get("data");
  options.stream = ctx.args.GetBool("stream");
  // A malformed spec is the user's to fix; catch it before anything is uploaded.
  auto source = options.stream ? StreamSourceFromSpec(data, options.stream_normalisation) : DataSourceFromSpec(data);
  if (!source.ok()) return UsageError(source.status());
  options.model_name = ctx.args.Get("name");
  options.bn_out = ctx.args.Get("bn_out");
  options.folded_out = ctx.args.Get("folded_out");
  options.report_out = ctx.args.Get("report");
  const std::string& model_path = ctx.args.positional()[0];
  const std::string out = ctx.args.Get("out");
  // A file is uploaded; anything else names a stored model, as submit's --model does.
  std::error_code no_file;
  if (!std::filesystem::exists(model_path, no_file)) options.stored_model = model_path;

  auto result = ctx.client.Recalibrate(model_path, data, options, out,
                                       [&](const Progress& p) { ShowProgress(ctx.progress, model_path, p); });
  if (!result.ok() && !options.stored_model.empty() && absl::IsNotFound(result.status())) {
    return Fail(absl::NotFoundError(
        absl::StrCat(result.status().message(), ", and '", model_path, "' is no file here either")));
  }
  if (!result.ok()) {
    // A job that ran and failed is still the answer: print it, then say why.
    if (std::optional<v1::Job> job = JobOfError(result.status())) {
      Emit(ctx, *job, JobText(*job));
      Fail(result.status());
      return ExitCodeForJob(*job);
    }
    return Fail(result.status());
  }
  std::string text = JobText(result->job);
  for (const DownloadResult& d : result->downloads) {
    absl::StrAppend(&text, "wrote: ", d.path, " (", d.size, " bytes, sha256 ", d.sha256, ")\n");
  }
  Emit(ctx, result->job, text);
  return kOk;
}

}  // namespace recal::ctl
