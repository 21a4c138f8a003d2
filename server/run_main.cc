// recal-run: the engine on local files, no server. Recalibrates one model (TorchScript or torch.export) and
// writes the model, the BatchNorm buffers and the report.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/command_line.h"
#include "common/enum_names.h"
#include "common/report_facts.h"
#include "common/status_macros.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/data/batch_source.h"
#include "server/data/normalization.h"
#include "server/data_access/data_shape.h"
#include "server/data_access/locate_objects.h"
#include "server/data_access/object_storage.h"
#include "server/engine/batch_moments.h"
#include "server/engine/folded_model.h"
#include "server/engine/recalibration.h"
#include "server/engine/report.h"
#include "server/s3/s3_flags.h"

ABSL_FLAG(std::string, model, "",
          "model to recalibrate: TorchScript (torch.jit.save, .pt) or a torch.export program "
          "(torch.export.save, .pt2), told apart by its bytes");
ABSL_FLAG(std::string, data, "",
          "data spec: npy:PATH | safetensors:PATH[:key,key...] | torch:PATH | "
          "synthetic:SHAPE[,seed=S] (SHAPE per sample, e.g. 3x224x224) | "
          "the file schemes take ?scale=S&mean=M,..&std=S,.. for uint8/float16 data | "
          "images:DIR[?resize=R&crop=C&mean=M,M,M&std=S,S,S&samples=N&seed=S&shuffle=0|1&on_bad=fail|skip]");
ABSL_FLAG(std::string, out, "", "where to write the recalibrated model (in the format it came in)");
ABSL_FLAG(std::string, bn_out, "", "optional: the BatchNorm buffers alone, as .safetensors");
ABSL_FLAG(std::string, folded_out, "",
          "optional (torch.export programs): the recalibrated model in eval mode with each BatchNorm that directly "
          "follows a convolution or linear layer folded into it, as .pt2 (docs/exported-programs.md)");
ABSL_FLAG(std::string, report, "", "optional: the report, as JSON");
ABSL_FLAG(int64_t, batch_size, 32, "samples per forward pass");
ABSL_FLAG(int64_t, max_batches, 0,
          "batches to use; 0: up to 200, fewer if the data ends first. A positive value must "
          "be available unless --allow_short_data");
ABSL_FLAG(bool, allow_short_data, false, "with --max_batches: use what there is if the data is shorter");
ABSL_FLAG(std::string, estimator, "population",
          "population (every sample weighs the same; exact) | batch_average (every batch "
          "weighs the same, as PaddleVideo and torch.optim.swa_utils.update_bn)");
ABSL_FLAG(std::string, modules, "eval",
          "what non-BatchNorm modules do: eval | train | as_saved");
ABSL_FLAG(std::string, include, "", "recalibrate only layers whose name matches this regex");
ABSL_FLAG(std::string, exclude, "", "leave layers whose name matches this regex as they are");
ABSL_FLAG(double, target_rel_error, 0,
          "stop once every layer's statistics have this relative standard error (0: never)");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda:N | a comma-separated list (shards go round the list)");
ABSL_FLAG(int32_t, iterations, 1,
          "passes over the data, each after the first with the statistics of the one before in the model's "
          "running buffers: for a forward that reads them (a quantization-aware Conv-BN scales its weight by "
          "the running variance), where one pass is one re-estimation step; the report says how far each "
          "moved them");
ABSL_FLAG(int32_t, shards, 1,
          "split the batches into this many contiguous shards run side by side (threads, each on the "
          "next --device, --threads shared between them) and merged exactly");
ABSL_FLAG(bool, trust_model, false,
          "skip the operator allowlist: the model is your own file and may do anything it says");
ABSL_FLAG(std::vector<std::string>, extra_allowed_ops, {},
          "operators (ns::name, comma-separated) the model may use beyond the built-in allowlist");
ABSL_FLAG(int32_t, threads, 0, "intra-op threads (0: LibTorch's default)");
ABSL_FLAG(std::string, memory_format, "auto",
          "layout of 4-d activations in the forward: auto (on CPU, channels_last for float32 "
          "images through depthwise convolutions, or through dense ones from 112x112 up, where it "
          "was measured faster; else contiguous) | contiguous | channels_last");
ABSL_FLAG(std::string, compute_dtype, "float32",
          "precision of the forward: float32 (exact, the default) | bfloat16 | float16: autocast, "
          "as a model deployed in that precision runs; statistics are still accumulated in float64 "
          "from what each BatchNorm sees");
ABSL_FLAG(int32_t, prefetch, 2, "batches prepared ahead on a background thread (0: none)");
ABSL_FLAG(int32_t, decode_threads, 0, "images: decoding threads (0: the cores, at most 8)");

namespace {

using recal::engine::Options;

absl::StatusOr<Options> OptionsFromFlags() {
  Options options;
  const std::string estimator = absl::GetFlag(FLAGS_estimator);
  const std::optional<recal::v1::Estimator> parsed_estimator = recal::EnumFromName<recal::v1::Estimator>(estimator);
  if (!parsed_estimator) {
    return absl::InvalidArgumentError(
        absl::StrCat("--estimator=", estimator, ": use ", recal::EnumNameList<recal::v1::Estimator>()));
  }
  options.estimator = *parsed_estimator;
  const std::string modules = absl::GetFlag(FLAGS_modules);
  const std::optional<recal::v1::ModuleMode> parsed_modules = recal::EnumFromName<recal::v1::ModuleMode>(modules);
  if (!parsed_modules) {
    return absl::InvalidArgumentError(
        absl::StrCat("--modules=", modules, ": use ", recal::EnumNameList<recal::v1::ModuleMode>()));
  }
  options.modules = *parsed_modules;
  options.include = absl::GetFlag(FLAGS_include);
  options.exclude = absl::GetFlag(FLAGS_exclude);
  if (absl::GetFlag(FLAGS_max_batches) < 0) return absl::InvalidArgumentError("--max_batches must be >= 0");
  if (absl::GetFlag(FLAGS_max_batches) > 0) options.max_batches = absl::GetFlag(FLAGS_max_batches);
  options.allow_short_data = absl::GetFlag(FLAGS_allow_short_data);
  options.target_rel_error = absl::GetFlag(FLAGS_target_rel_error);
  options.iterations = absl::GetFlag(FLAGS_iterations);
  options.device = absl::GetFlag(FLAGS_device);
  options.threads = absl::GetFlag(FLAGS_threads);
  const std::string format = absl::GetFlag(FLAGS_memory_format);
  auto memory_format = recal::engine::ParseMemoryFormat(format);
  if (!memory_format.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory_format=", format, ": use ", recal::EnumNameList<recal::v1::MemoryFormat>()));
  }
  options.memory_format = *memory_format;
  auto compute_dtype = recal::engine::ParseComputeDtype(absl::GetFlag(FLAGS_compute_dtype));
  if (!compute_dtype.ok()) return compute_dtype.status();
  options.compute_dtype = *compute_dtype;
  options.graph_policy.trusted = absl::GetFlag(FLAGS_trust_model);
  options.graph_policy.extra_allowed_ops = absl::GetFlag(FLAGS_extra_allowed_ops);
  return options;
}

// Progress on stderr: a line per second at most, and one at the end. Shards report
// their own progress; the line sums them.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(int shards) : shards_(shards) {}

  void operator()(int shard, const recal::engine::Progress& p) {
    std::lock_guard<std::mutex> lock(mu_);
    shards_[shard] = p;
    recal::engine::Progress sum;
    sum.rel_std_error = 0;
    for (const auto& s : shards_) {
      sum.batches += s.batches;
      sum.samples += s.samples;
      sum.max_batches += s.max_batches;
      sum.seconds = std::max(sum.seconds, s.seconds);
      sum.rel_std_error = std::max(sum.rel_std_error, s.rel_std_error);
    }
    const auto now = std::chrono::steady_clock::now();
    if (sum.batches < sum.max_batches && now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    std::string rel = shards_.size() == 1 && std::isfinite(sum.rel_std_error)
                          ? absl::StrFormat("  rel.err %.2g", sum.rel_std_error)
                          : std::string(shards_.size() == 1 ? "  rel.err -" : "");
    std::cerr << absl::StrFormat("recal-run: batch %d/%d  %d samples  %.1f samples/s%s\n", sum.batches,
                                 sum.max_batches, sum.samples, sum.seconds > 0 ? sum.samples / sum.seconds : 0.0,
                                 rel);
  }

 private:
  std::mutex mu_;
  std::vector<recal::engine::Progress> shards_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

// The result is written in the format the model came in: a PT2 archive named .pt (or
// TorchScript named .pt2) would mislead whoever loads it by its name. Other names are the
// user's to choose.
absl::Status CheckOutName(recal::engine::ModelFormat format, const std::string& out) {
  const bool exported = format == recal::engine::ModelFormat::kExportedProgram;
  const absl::string_view stem(out.data(), out.rfind('.') == std::string::npos ? out.size() : out.rfind('.'));
  if (exported && (absl::EndsWith(out, ".pt") || absl::EndsWith(out, ".pth"))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--out ", out, ": the model is a torch.export program, and so is the result (a PT2 archive, which "
        "torch.export.load opens and torch.jit.load does not): name it ", stem, ".pt2"));
  }
  if (!exported && absl::EndsWith(out, ".pt2")) {
    return absl::InvalidArgumentError(absl::StrCat("--out ", out, ": the model is TorchScript, and so is the result "
                                                   "(torch.jit.load opens it, torch.export.load does not): name it ",
                                                   stem, ".pt"));
  }
  return absl::OkStatus();
}

// A folded model is made of exported programs only (server/engine/folded_model.h): said
// before the data runs, not after.
absl::Status CheckFoldedOut(const std::string& model, recal::engine::ModelFormat format,
                            const std::string& folded_out) {
  if (folded_out.empty()) return absl::OkStatus();
  if (format != recal::engine::ModelFormat::kExportedProgram) {
    return absl::FailedPreconditionError(
        absl::StrCat("--folded_out: ", model, " is TorchScript; ", recal::kFoldNeedsExportedProgram));
  }
  if (absl::EndsWith(folded_out, ".pt") || absl::EndsWith(folded_out, ".pth")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--folded_out ", folded_out, ": the folded model is a PT2 archive: name it .pt2"));
  }
  return absl::OkStatus();
}

// The data against the model's input contract before any batch runs (each batch is checked
// again as it comes), and what the engine will cast, said once.
absl::Status CheckDataUpFront(const recal::engine::Recalibration& run, const recal::data::DataSpec& data,
                              int64_t batch_size, const Options& options, bool say_casts) {
  RECAL_RETURN_IF_ERROR(recal::data::CheckDataShape(run.inputs(), data, batch_size,
                                                    options.max_batches.value_or(recal::engine::kDefaultMaxBatches)));
  if (const std::optional<recal::DataShape> shape = recal::data::PeekDataShape(data); shape && say_casts) {
    for (const std::string& note : recal::CastNotes(run.inputs(), shape->samples)) {
      std::cerr << "recal-run: " << note << "\n";
    }
  }
  return absl::OkStatus();
}

// One shard: its batches of the data, its own copy of the model; its statistics, or why not.
struct ShardRun {
  std::unique_ptr<recal::engine::Recalibration> run;
  std::string data_description;
  int64_t skipped_files = 0;
  absl::Status status;
};

ShardRun RunShard(const std::string& model, const recal::data::DataSpec& data, int64_t batch_size,
                  const recal::data::InputOptions& input, const Options& options, int index, int shards,
                  ProgressPrinter& progress) {
  ShardRun out;
  recal::data::ShardPlan plan{index, shards, options.max_batches.value_or(0), recal::engine::kDefaultMaxBatches,
                              options.allow_short_data};
  auto shard = recal::data::OpenBatchSourceShard(data, batch_size, input, plan);
  if (!shard.ok()) {
    out.status = shard.status();
    return out;
  }
  out.data_description = shard->source->Describe();
  Options shard_options = recal::engine::ShardOptions(options, shards, shard->range.count);
  shard_options.preload_output_copy = index == 0;  // shard 0 merges the others and writes the model
  auto run = recal::engine::Recalibration::Create(model, shard_options);
  if (!run.ok()) {
    out.status = run.status();
    return out;
  }
  out.status = CheckDataUpFront(**run, data, batch_size, options, index == 0);
  if (!out.status.ok()) return out;
  // Cast before the forward (the notes were said above): the layout suits the program's dtype.
  const auto cast = [&](std::unique_ptr<recal::data::BatchSource> source) {
    return recal::data::CastToModelDtypes(std::move(source), (*run)->inputs());
  };
  shard->source = cast(std::move(shard->source));
  auto on_progress = [&](const recal::engine::Progress& p) { progress(index, p); };
  if (shards > 1) {
    out.status = (*run)->RunShard([&] { return shard->source->Next(); }, on_progress);
  } else {
    // The whole data, once per pass (--iterations): each pass after the first reads it again.
    int opened = 0;
    auto open_pass = [&]() -> absl::StatusOr<recal::engine::NextBatchFn> {
      if (opened++ > 0) {
        auto again = recal::data::OpenBatchSourceShard(data, batch_size, input, plan);
        if (!again.ok()) return again.status();
        shard->source = cast(std::move(again->source));
      }
      return recal::engine::NextBatchFn([&] { return shard->source->Next(); });
    };
    out.status = (*run)->RunPasses(open_pass, on_progress);
  }
  out.skipped_files = shard->source->skipped_files();
  out.run = *std::move(run);
  return out;
}

absl::Status RunMain() {
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string data_flag = absl::GetFlag(FLAGS_data);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (model.empty() || data_flag.empty() || out.empty()) {
    return absl::InvalidArgumentError("--model, --data and --out are required (see --help)");
  }
  RECAL_ASSIGN_OR_RETURN(const recal::data::DataSpec data, recal::data::ParseDataSpec(data_flag));
  // The format is told from the bytes once: both outputs are named for it.
  RECAL_ASSIGN_OR_RETURN(auto model_file, recal::engine::OpenModelFile(model));
  RECAL_ASSIGN_OR_RETURN(const recal::engine::ModelFormat format, recal::engine::DetectModelFormat(model_file));
  RECAL_RETURN_IF_ERROR(CheckOutName(format, out));
  const std::string folded_out = absl::GetFlag(FLAGS_folded_out);
  RECAL_RETURN_IF_ERROR(CheckFoldedOut(model, format, folded_out));
  const int64_t batch_size = absl::GetFlag(FLAGS_batch_size);
  if (batch_size < 1) return absl::InvalidArgumentError("--batch_size must be at least 1");
  auto options = OptionsFromFlags();
  if (!options.ok()) return options.status();

  if (absl::GetFlag(FLAGS_prefetch) < 0 || absl::GetFlag(FLAGS_decode_threads) < 0) {
    return absl::InvalidArgumentError("--prefetch and --decode_threads must be >= 0");
  }
  const int shards = absl::GetFlag(FLAGS_shards);
  if (shards < 1) return absl::InvalidArgumentError("--shards must be at least 1");
  if (shards > 1 && options->iterations > 1) {
    return absl::InvalidArgumentError("--iterations with --shards: each pass needs the statistics of the whole "
                                      "data before the next starts; give one or the other");
  }
  const std::vector<std::string> devices = absl::StrSplit(options->device, ',', absl::SkipEmpty());
  if (devices.empty()) return absl::InvalidArgumentError("--device is empty");
  const int threads = options->threads > 0 ? options->threads : static_cast<int>(std::thread::hardware_concurrency());
  if (shards > 1) options->threads = std::max(1, threads / shards);

  // Object storage only for data in a bucket: credentials are looked up only then.
  std::shared_ptr<recal::data::ObjectStorage> object_storage;
  if (recal::data::ReadsObjectStorage(data)) {
    auto settings = recal::data::ObjectStorageOptions(recal::s3::S3SettingsFromFlags());
    if (!settings.ok()) return settings.status();
    auto storage = recal::data::ConnectBucket(*settings);
    if (!storage.ok()) return storage.status();
    object_storage = *std::move(storage);
  }

  std::vector<ShardRun> runs(shards);
  ProgressPrinter progress(shards);
  std::vector<std::thread> threads_of_shards;
  for (int k = 0; k < shards; ++k) {
    Options shard_options = *options;
    shard_options.device = devices[k % devices.size()];
    recal::data::InputOptions input{.prefetch_depth = absl::GetFlag(FLAGS_prefetch),
                                    .decode_threads = absl::GetFlag(FLAGS_decode_threads),
                                    .pin_memory = absl::StartsWith(shard_options.device, "cuda")};
    input.access.object_storage = object_storage;
    threads_of_shards.emplace_back([&, k, shard_options, input] {
      runs[k] = RunShard(model, data, batch_size, input, shard_options, k, shards, progress);
    });
  }
  for (std::thread& t : threads_of_shards) t.join();
  for (const ShardRun& shard : runs) {
    if (!shard.status.ok()) return shard.status;
  }
  std::cerr << "recal-run: data " << runs[0].data_description << "\n";
  // Shard 0 takes in the others' statistics, in shard order.
  std::unique_ptr<recal::engine::Recalibration>& run = runs[0].run;
  int64_t skipped_files = runs[0].skipped_files;
  for (int k = 1; k < shards; ++k) {
    if (absl::Status merged = run->Merge(runs[k].run->Statistics()); !merged.ok()) return merged;
    skipped_files += runs[k].skipped_files;
  }
  if (absl::Status finished = run->Finish(); !finished.ok()) return finished;

  if (absl::Status s = run->WriteModel(out); !s.ok()) return s;
  if (const std::string bn_out = absl::GetFlag(FLAGS_bn_out); !bn_out.empty()) {
    if (absl::Status s = run->WriteBatchNormBuffers(bn_out); !s.ok()) return s;
  }
  recal::v1::RunReport report = run->Report();
  report.set_data(data_flag);
  report.set_batch_size(batch_size);
  report.set_skipped_files(skipped_files);
  report.set_shards(shards);
  report.set_device(options->device);  // shard 0's report: every device the shards ran on
  if (!folded_out.empty()) {
    RECAL_RETURN_IF_ERROR(recal::engine::WriteFoldedModel(out, folded_out, &report));
  }
  if (const std::string path = absl::GetFlag(FLAGS_report); !path.empty()) {
    if (absl::Status s = recal::engine::WriteReportJson(path, report); !s.ok()) return s;
  }
  std::cerr << absl::StrFormat(
      "recal-run: recalibrated %d BatchNorm layers (%d unused) from %d batches, %d samples%s, "
      "in %.2f s (%s, %s); wrote %s\n",
      report.layers_recalibrated(), report.unused_layers_size(), report.batches(), report.samples(),
      report.skipped_files() > 0 ? absl::StrCat(" (", report.skipped_files(), " bad files skipped)") : "",
      report.seconds(), report.memory_format(), report.compute_dtype(), out);
  if (report.has_fold()) std::cerr << "recal-run: " << recal::FoldFact(report) << "; wrote " << folded_out << "\n";
  if (const std::string quantizers = recal::QuantizersFact(report); !quantizers.empty()) {
    std::cerr << "recal-run: quantizers: " << quantizers << "\n";
  }
  if (const std::string passes = recal::IterationsFact(report); !passes.empty()) {
    std::cerr << "recal-run: statistics moved by " << passes << "\n";
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  recal::ParseCommandLineOrExit(
      argc, argv, "recal-run",
      "recalibrates the BatchNorm statistics of a TorchScript model or torch.export program on local data\n"
      "  recal-run --model M.pt|M.pt2 --data npy:X.npy --out OUT.pt|OUT.pt2 [--bn_out BN.safetensors] [--folded_out FOLDED.pt2] "
      "[--report R.json] [options]",
      recal::engine::GpuStatisticsBuild());
  absl::Status status = RunMain();
  if (!status.ok()) {
    std::string message(status.message());
    for (char& c : message) if (c == '\n') c = ' ';
    std::cerr << "recal-run: " << message << "\n";
    return 1;
  }
  return 0;
}
