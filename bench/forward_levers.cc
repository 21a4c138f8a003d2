// The forward-pass levers of issue 17, side by side in one process over the same batches:
// the engine's forward under no-grad vs inference mode, contiguous vs channels-last, the
// whole forward vs one that ends at the last BatchNorm, and the plain train-mode forward in
// both layouts (channels-last inputs alone, or inputs and weights). Then the fixed costs
// around the loop: creating the run (load, validate, instrument), writing the model (a
// second load, save, the reload check) and the buffers. Every repetition runs every configuration once, in an order that rotates, and
// each ratio is taken within a repetition: the printed figures are medians of those, so
// that drift on a shared machine hits both sides of a ratio alike.
//
//   forward_levers --models resnet18=r18.pt,mobilenet_v2=mv2.pt [--batch_size 32
//                  --shape 3x112x112 --batches 4 --reps 9 --threads 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/script.h>
#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/median.h"
#include "bench/timing.h"
#include "common/atomic_file.h"
#include "common/command_line.h"
#include "server/engine/recalibration.h"

ABSL_FLAG(std::vector<std::string>, models, {}, "NAME=PATH,... TorchScript models");
ABSL_FLAG(int64_t, batch_size, 32, "samples per batch");
ABSL_FLAG(std::string, shape, "3x112x112", "per-sample input shape");
ABSL_FLAG(int32_t, batches, 4, "batches per configuration and repetition");
ABSL_FLAG(int32_t, reps, 9, "interleaved repetitions (>= 5)");
ABSL_FLAG(int32_t, threads, 2, "intra-op threads");

namespace {

using recal::bench::Median;
using recal::bench::TimeIt;
using recal::engine::MemoryFormat;

struct Config {
  std::string name;
  std::function<void(const at::Tensor&)> forward;
  std::vector<double> seconds;  // per repetition
};

// The engine as recal-run drives it, with one lever set.
Config Engine(const std::string& path, bool inference_mode, MemoryFormat format, bool end_at_last = true) {
  recal::engine::Options options;
  options.threads = absl::GetFlag(FLAGS_threads);
  options.inference_mode = inference_mode;
  options.memory_format = format;
  options.end_at_last_batch_norm = end_at_last;
  auto created = recal::engine::Recalibration::Create(path, options);
  if (!created.ok()) {
    std::fprintf(stderr, "%s: %s\n", path.c_str(), created.status().ToString().c_str());
    std::exit(1);
  }
  std::shared_ptr<recal::engine::Recalibration> run = *std::move(created);
  std::string name = absl::StrCat("recal ", inference_mode ? "inference" : "no_grad", " ",
                                  recal::engine::MemoryFormatName(format), end_at_last ? "" : " whole");
  return {name, [run](const at::Tensor& batch) {
            if (absl::Status fed = run->Feed({batch}); !fed.ok()) {
              std::fprintf(stderr, "%s\n", fed.ToString().c_str());
              std::exit(1);
            }
          }};
}

// What a user's own loop runs: the model in train mode under no-grad, with its input (and
// optionally its 4-d weights) channels-last or not.
Config Plain(const std::string& path, bool channels_last_input, bool channels_last_weights) {
  auto model = std::make_shared<torch::jit::Module>(torch::jit::load(path));
  model->train();
  if (channels_last_weights) {
    torch::NoGradGuard no_grad;
    for (at::Tensor p : model->parameters()) {
      if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
    }
  }
  std::string name = !channels_last_input ? "plain contiguous"
                     : channels_last_weights ? "plain channels_last in+weights"
                                             : "plain channels_last input only";
  return {name, [model, channels_last_input](const at::Tensor& batch) {
            torch::NoGradGuard no_grad;
            model->forward({channels_last_input ? batch.contiguous(at::MemoryFormat::ChannelsLast)
                                                : batch});
          }};
}

void Measure(const std::string& name, const std::string& path, const std::vector<at::Tensor>& batches) {
  std::vector<Config> configs;
  configs.push_back(Engine(path, false, MemoryFormat::kContiguous));       // 0: before issue 17
  configs.push_back(Engine(path, true, MemoryFormat::kContiguous));        // 1
  configs.push_back(Engine(path, false, MemoryFormat::kChannelsLast));     // 2
  configs.push_back(Engine(path, true, MemoryFormat::kChannelsLast));      // 3
  configs.push_back(Plain(path, false, false));                            // 4
  configs.push_back(Plain(path, true, false));                             // 5
  configs.push_back(Plain(path, true, true));                              // 6
  configs.push_back(Engine(path, true, MemoryFormat::kChannelsLast, false));  // 7
  auto run = [&](Config& c) {
    for (const at::Tensor& b : batches) c.forward(b);
  };
  // The profiling executor specialises each graph in its first runs.
  for (int i = 0; i < 2; ++i) {
    for (Config& c : configs) run(c);
  }
  const int reps = absl::GetFlag(FLAGS_reps);
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t k = 0; k < configs.size(); ++k) {
      Config& c = configs[(rep + k) % configs.size()];
      c.seconds.push_back(TimeIt([&] { run(c); }));
    }
  }
  const double per_batch = 1.0 / batches.size();
  std::printf("\n%s: %zu batches of %s per configuration and rep, %d threads, %d reps\n", name.c_str(),
              batches.size(), absl::StrJoin(batches[0].sizes(), "x").c_str(), absl::GetFlag(FLAGS_threads),
              reps);
  std::printf("  %-34s %10s %10s %10s\n", "configuration", "median_s", "min_s", "max_s");
  for (const Config& c : configs) {
    const auto [lo, hi] = std::minmax_element(c.seconds.begin(), c.seconds.end());
    std::printf("  %-34s %10.4f %10.4f %10.4f   (per batch)\n", c.name.c_str(), Median(c.seconds) * per_batch,
                *lo * per_batch, *hi * per_batch);
  }
  struct Ratio {
    const char* what;
    int num, den;
  };
  const Ratio ratios[] = {
      {"inference / no_grad, contiguous", 1, 0},
      {"inference / no_grad, channels_last", 3, 2},
      {"channels_last / contiguous, no_grad", 2, 0},
      {"channels_last / contiguous, inference", 3, 1},
      {"end at last BN / whole forward", 3, 7},
      {"all levers / none (engine)", 3, 0},
      {"plain: channels_last input / contiguous", 5, 4},
      {"plain: channels_last in+weights / contig.", 6, 4},
      {"plain: in+weights / input only", 6, 5},
      {"recal / plain, contiguous (no_grad)", 0, 4},
      {"recal / plain, channels_last (inference)", 3, 6},
  };
  std::printf("  %-44s %8s %8s %8s\n", "ratio (per rep)", "median", "min", "max");
  for (const Ratio& r : ratios) {
    std::vector<double> v;
    for (int rep = 0; rep < reps; ++rep) v.push_back(configs[r.num].seconds[rep] / configs[r.den].seconds[rep]);
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    std::printf("  %-44s %8.3f %8.3f %8.3f\n", r.what, Median(v), *lo, *hi);
  }
}

// Milliseconds of each fixed cost around the loop, medians of `reps` runs: what recal-run
// pays once per job besides its batches (process start is timed by bench/baselines_compare.py).
void MeasureFixedCosts(const std::string& name, const std::string& path, const at::Tensor& batch,
                       const std::string& scratch) {
  std::vector<double> create, first, next, write_model, write_buffers, load, save, reload, write_file;
  recal::engine::Options options;
  options.threads = absl::GetFlag(FLAGS_threads);
  for (int rep = 0; rep < std::max(3, absl::GetFlag(FLAGS_reps) / 2); ++rep) {
    std::unique_ptr<recal::engine::Recalibration> run;
    create.push_back(TimeIt([&] { run = *recal::engine::Recalibration::Create(path, options); }));
    first.push_back(TimeIt([&] { (void)run->Feed({batch}); }));
    next.push_back(TimeIt([&] { (void)run->Feed({batch}); }));
    write_model.push_back(TimeIt([&] { (void)run->WriteModel(scratch + "/model.pt"); }));
    write_buffers.push_back(TimeIt([&] { (void)run->WriteBatchNormBuffers(scratch + "/bn.safetensors"); }));
    // What WriteModel does, one part at a time: the never rewritten copy (loaded beside
    // create and the first batches), save, and the reload check beside the file's write.
    torch::jit::Module copy;
    load.push_back(TimeIt([&] { copy = torch::jit::load(path); }));
    std::string bytes;
    save.push_back(TimeIt([&] {
      torch::jit::ExportModule(copy, [&bytes](const void* data, size_t n) {
        bytes.append(static_cast<const char*>(data), n);
        return n;
      });
    }));
    reload.push_back(TimeIt([&] {
      std::istringstream in(bytes);
      torch::jit::load(in);
    }));
    write_file.push_back(TimeIt([&] { (void)recal::WriteFileAtomically(scratch + "/copy.pt", bytes); }));
  }
  std::printf("\n%s fixed costs (ms, median of %zu; batch %s)\n", name.c_str(), create.size(),
              absl::StrJoin(batch.sizes(), "x").c_str());
  const std::pair<const char*, const std::vector<double>*> rows[] = {
      {"create: load + validate + instrument", &create},
      {"first batch (executor specialises)", &first},
      {"a later batch", &next},
      {"write model", &write_model},
      {"  load of the copy written (beside create)", &load},
      {"  save", &save},
      {"  reload check (beside the file's write)", &reload},
      {"  write the file (fsync, rename)", &write_file},
      {"write BatchNorm buffers", &write_buffers},
  };
  for (const auto& [what, v] : rows) std::printf("  %-40s %9.1f\n", what, Median(*v) * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  recal::ParseCommandLineOrExit(argc, argv, "forward_levers", "forward_levers: issue 17's forward levers (inference mode, channels-last, truncation) side by side");
  if (absl::GetFlag(FLAGS_models).empty()) {
    std::fprintf(stderr, "--models NAME=PATH,... is required\n");
    return 2;
  }
  at::set_num_threads(absl::GetFlag(FLAGS_threads));
  const std::vector<at::Tensor> batches = recal::bench::RandomBatches(
      absl::GetFlag(FLAGS_batch_size), absl::GetFlag(FLAGS_shape), absl::GetFlag(FLAGS_batches));
  const std::string scratch = std::filesystem::temp_directory_path() / absl::StrCat("forward_levers.", getpid());
  std::filesystem::create_directories(scratch);
  std::printf("forward levers: medians of per-rep ratios, configurations interleaved in rotating order\n");
  for (const std::string& model : absl::GetFlag(FLAGS_models)) {
    std::pair<std::string, std::string> named = absl::StrSplit(model, absl::MaxSplits('=', 1));
    const std::string path = named.second.empty() ? named.first : named.second;
    Measure(named.first, path, batches);
    MeasureFixedCosts(named.first, path, batches[0], scratch);
  }
  std::filesystem::remove_all(scratch);
  return 0;
}
