// What recalibration costs beyond the forward passes themselves: in one process, over the
// same batches, interleaved, the plain train-mode forward of the model vs the instrumented
// forward that accumulates every BatchNorm's statistics. Prints a table and the median ratio.
//
//   recalibration_overhead --model resnet18.pt [--batch_size 32 --shape 3x112x112
//                          --batches 10 --reps 7 --threads 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/script.h>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/median.h"
#include "bench/timing.h"
#include "common/command_line.h"
#include "server/engine/recalibration.h"

ABSL_FLAG(std::string, model, "", "TorchScript model (bench/run_benchmarks.sh makes resnet18)");
ABSL_FLAG(int64_t, batch_size, 32, "samples per batch");
ABSL_FLAG(std::string, shape, "3x112x112", "per-sample input shape");
ABSL_FLAG(int32_t, batches, 10, "batches per repetition");
ABSL_FLAG(int32_t, reps, 7, "interleaved repetitions (>= 5)");
ABSL_FLAG(int32_t, threads, 2, "intra-op threads");

using recal::bench::Median;
using recal::bench::TimeIt;

int main(int argc, char** argv) {
  recal::ParseCommandLineOrExit(argc, argv, "recalibration_overhead", "recalibration_overhead: recalibration's forward vs a plain train-mode forward over the same batches");
  const std::string model_path = absl::GetFlag(FLAGS_model);
  if (model_path.empty()) {
    std::fprintf(stderr, "--model is required\n");
    return 2;
  }
  at::set_num_threads(absl::GetFlag(FLAGS_threads));
  const std::vector<at::Tensor> batches = recal::bench::RandomBatches(
      absl::GetFlag(FLAGS_batch_size), absl::GetFlag(FLAGS_shape), absl::GetFlag(FLAGS_batches));

  torch::jit::Module plain = torch::jit::load(model_path);
  plain.train();
  recal::engine::Options options;
  options.threads = absl::GetFlag(FLAGS_threads);
  auto recal = recal::engine::Recalibration::Create(model_path, options);
  if (!recal.ok()) {
    std::fprintf(stderr, "%s\n", recal.status().ToString().c_str());
    return 1;
  }
  torch::NoGradGuard no_grad;
  auto run_plain = [&] {
    for (const at::Tensor& b : batches) plain.forward({b});
  };
  auto run_recal = [&] {
    for (const at::Tensor& b : batches) {
      if (!(*recal)->Feed({b}).ok()) std::abort();
    }
  };
  // The profiling executor specialises the graph in the first runs: warm both up.
  for (int i = 0; i < 3; ++i) {
    run_plain();
    run_recal();
  }
  std::printf("recalibration overhead: %s, %d batches of %s per rep, %d threads\n",
              model_path.c_str(), absl::GetFlag(FLAGS_batches),
              absl::StrJoin(batches[0].sizes(), "x").c_str(), absl::GetFlag(FLAGS_threads));
  std::printf("%4s %12s %12s %8s\n", "rep", "forward_s", "recal_s", "ratio");
  std::vector<double> ratios;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
    // Alternate which goes first so that drift on a shared machine hits both alike.
    double p, r;
    if (rep % 2 == 0) {
      p = TimeIt(run_plain);
      r = TimeIt(run_recal);
    } else {
      r = TimeIt(run_recal);
      p = TimeIt(run_plain);
    }
    ratios.push_back(r / p);
    std::printf("%4d %12.3f %12.3f %8.3f\n", rep, p, r, r / p);
  }
  std::printf("median ratio recalibration / plain forward: %.3f\n", Median(ratios));
  return 0;
}
