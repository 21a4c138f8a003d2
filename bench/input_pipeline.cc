// The input pipeline over an image folder (bench/make_image_folder.py makes one), in one
// process, repetitions interleaved, medians reported:
//   1. decoding throughput (images/s) against the number of decoding threads;
//   2. a recalibration over the folder against max(decode-only, forward-only) over the same
//      batches, with the machine's cores split between decoding and the forward pass. A
//      ratio near 1 means the forward never waits for data that could have been ready.
//
//   input_pipeline --model resnet18.pt --folder DIR [--resize 128 --crop 112 --batch_size 32
//                  --thread_list 1,2 --decode_threads 1 --threads 1 --reps 5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/command_line.h"
#include "common/data_spec.h"
#include "bench/median.h"
#include "server/data/batch_source.h"
#include "server/data/image_source.h"
#include "server/engine/recalibration.h"

ABSL_FLAG(std::string, model, "", "TorchScript model");
ABSL_FLAG(std::string, folder, "", "image folder");
ABSL_FLAG(int64_t, resize, 128, "Resize(R)");
ABSL_FLAG(int64_t, crop, 112, "CenterCrop(C)");
ABSL_FLAG(int64_t, batch_size, 32, "samples per batch");
ABSL_FLAG(std::string, thread_list, "1,2", "decoding thread counts for the throughput table");
ABSL_FLAG(int32_t, decode_threads, 1, "decoding threads during the recalibration");
ABSL_FLAG(int32_t, threads, 1, "intra-op threads of the forward pass");
ABSL_FLAG(int32_t, reps, 5, "interleaved repetitions");

namespace {

using recal::bench::Median;

using recal::data::Batch;
using recal::data::BatchSource;
using recal::data::InputOptions;

double Seconds(const std::function<absl::Status()>& fn, absl::Status* status) {
  const auto start = std::chrono::steady_clock::now();
  *status = fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string Spec() {
  return absl::StrCat("images:", absl::GetFlag(FLAGS_folder), "?resize=", absl::GetFlag(FLAGS_resize),
                      "&crop=", absl::GetFlag(FLAGS_crop), "&mean=0.485,0.456,0.406&std=0.229,0.224,0.225");
}

absl::StatusOr<std::unique_ptr<BatchSource>> Open(const InputOptions& options) {
  return recal::data::OpenBatchSource(Spec(), absl::GetFlag(FLAGS_batch_size), options);
}

// Reads every batch; `keep` collects them when not null. `dct_scaling`: decode JPEGs at a
// reduced DCT size (faster, but no longer torchvision's pixels: not offered in specs).
absl::Status Drain(const InputOptions& options, std::vector<Batch>* keep, int64_t* images,
                   bool dct_scaling = false) {
  absl::StatusOr<std::unique_ptr<BatchSource>> source;
  if (dct_scaling) {
    source = recal::data::OpenImageSource(*recal::data::ParseDataSpec(Spec()), absl::GetFlag(FLAGS_batch_size),
                                          {.threads = options.decode_threads, .jpeg_dct_scaling = true});
  } else {
    source = Open(options);
  }
  if (!source.ok()) return source.status();
  *images = 0;
  while (true) {
    auto batch = (*source)->Next();
    if (!batch.ok()) return batch.status();
    if (!batch->has_value()) return absl::OkStatus();
    *images += (**batch)[0].size(0);
    if (keep) keep->push_back(**std::move(batch));
  }
}

// One recalibration over `next`; `seconds` is Run() alone (Create(), the model's load and
// rewrite, is the same for every variant and not what is measured).
absl::Status Recalibrate(const std::function<absl::StatusOr<std::optional<Batch>>()>& next, double* seconds) {
  recal::engine::Options options;
  options.threads = absl::GetFlag(FLAGS_threads);
  options.max_batches = 1 << 20;
  options.allow_short_data = true;
  auto run = recal::engine::Recalibration::Create(absl::GetFlag(FLAGS_model), options);
  if (!run.ok()) return run.status();
  absl::Status status;
  *seconds = Seconds([&] { return (*run)->Run(next, {}); }, &status);
  return status;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "input_pipeline: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  recal::ParseCommandLineOrExit(argc, argv, "input_pipeline", "input_pipeline: image-folder decoding throughput by threads, and a recalibration over the folder vs its parts");
  if (absl::GetFlag(FLAGS_model).empty() || absl::GetFlag(FLAGS_folder).empty()) {
    std::fprintf(stderr, "--model and --folder are required\n");
    return 2;
  }
  std::vector<int> thread_list;
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_thread_list), ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(t, &v) || v < 1) return 2;
    thread_list.push_back(v);
  }
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  absl::Status status;

  // 1. Decoding throughput.
  std::vector<std::vector<double>> decode(thread_list.size()), dct(thread_list.size());
  int64_t images = 0;
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < thread_list.size(); ++i) {
      const InputOptions options{.prefetch_depth = 0, .decode_threads = thread_list[i]};
      decode[i].push_back(Seconds([&] { return Drain(options, nullptr, &images); }, &status));
      if (!status.ok()) return Fail(status);
      dct[i].push_back(Seconds([&] { return Drain(options, nullptr, &images, true); }, &status));
      if (!status.ok()) return Fail(status);
    }
  }
  std::printf("decoding %lld images (resize %lld, crop %lld), median of %d\n", static_cast<long long>(images),
              static_cast<long long>(absl::GetFlag(FLAGS_resize)), static_cast<long long>(absl::GetFlag(FLAGS_crop)),
              reps);
  std::printf("%-16s %12s %12s %22s\n", "decode threads", "images/s", "vs 1 thread",
              "DCT-scaled images/s *");
  const double base = images / Median(decode[0]);
  for (size_t i = 0; i < thread_list.size(); ++i) {
    const double rate = images / Median(decode[i]);
    std::printf("%-16d %12.1f %12.2f %22.1f\n", thread_list[i], rate, rate / base, images / Median(dct[i]));
  }
  std::printf("* libjpeg-turbo's reduced-size DCT decoding: not torchvision's pixels, so not offered\n");

  // 2. Recalibration against max(decode-only, forward-only).
  const InputOptions pipeline{.prefetch_depth = 2, .decode_threads = absl::GetFlag(FLAGS_decode_threads)};
  std::vector<Batch> decoded;
  if (absl::Status s = Drain(pipeline, &decoded, &images); !s.ok()) return Fail(s);
  std::vector<double> decode_only, forward_only, full;
  for (int r = 0; r < reps; ++r) {
    decode_only.push_back(Seconds([&] { return Drain(pipeline, nullptr, &images); }, &status));
    if (!status.ok()) return Fail(status);
    double t = 0;
    size_t next = 0;
    status = Recalibrate(
        [&]() -> absl::StatusOr<std::optional<Batch>> {
          if (next == decoded.size()) return std::optional<Batch>();
          return std::optional<Batch>(decoded[next++]);
        },
        &t);
    if (!status.ok()) return Fail(status);
    forward_only.push_back(t);
    // The source is opened (files listed) outside the timed part, like the model.
    auto source = Open(pipeline);
    if (!source.ok()) return Fail(source.status());
    status = Recalibrate([&] { return (*source)->Next(); }, &t);
    if (!status.ok()) return Fail(status);
    full.push_back(t);
  }
  const double d = Median(decode_only), f = Median(forward_only), j = Median(full);
  std::printf("\nrecalibration over the folder: %zu batches of %lld, %d decoding + %d forward threads, median of %d\n",
              decoded.size(), static_cast<long long>(absl::GetFlag(FLAGS_batch_size)),
              absl::GetFlag(FLAGS_decode_threads), absl::GetFlag(FLAGS_threads), reps);
  std::printf("%-34s %10s\n", "", "seconds");
  std::printf("%-34s %10.3f\n", "decode only (pipeline, no model)", d);
  std::printf("%-34s %10.3f\n", "forward only (batches in memory)", f);
  std::printf("%-34s %10.3f\n", "recalibration (pipeline + model)", j);
  std::printf("ratio recalibration / max(decode, forward): %.3f (target <= 1.15)\n", j / std::max(d, f));
  return 0;
}
