// A RunReport made in C++ for the recalctl report tests: layers whose largest mean shifts are
// all different and out of order, and one layer for each flag.
#pragma once

#include <cmath>
#include <string>

#include "recal/v1/report.pb.h"

namespace recal::testing {

// A layer name an attacker could upload: if it reaches a page unescaped, the script renames
// the page.
inline const std::string kHostileLayerName = "layer3.bn<script>document.title='pwned'</script>";

inline constexpr int kSampleUsedLayers = 20;  // layer0.bn .. layer19.bn, all recalibrated
// Besides: "stem.bn" (excluded, first) and "head.bn" (never ran, last).
inline constexpr int kSampleLayers = kSampleUsedLayers + 2;

// Layer i's largest mean shift: a permutation of 1 .. 20 (7 and 20 are coprime), so report
// order and shift order differ: layer17.bn moved most (20), then layer14.bn (19), layer11.bn
// (18); layer0.bn least (1). The default top 15 leaves out layers 12, 9, 6, 3 and 0.
inline double SampleMaxShift(int i) { return 1 + (i * 7) % kSampleUsedLayers; }

// The convergence history: a point after each of batches 2 .. 25 (every layer runs once a
// batch, so the first estimate is after the second), ending at layer5.bn's 9%.
inline constexpr int kSampleConvergencePoints = 24;

// Flags: layer5.bn rel.err 9% (> 5%), layer7.bn 2 zero-variance channels, layer9.bn one call
// (no error estimate).
inline v1::RunReport SampleReport() {
  v1::RunReport report;
  report.set_model("sha256:0123abcd");
  report.set_model_format("torchscript");
  report.set_data("npy:data/val.npy");
  report.set_estimator(v1::BATCH_AVERAGE);
  report.set_modules(v1::EVAL);
  report.set_device("cpu");
  report.set_batch_size(8);
  report.set_batches(25);
  report.set_samples(200);
  report.set_seconds(2.5);
  report.set_samples_per_second(80);
  report.set_layers_recalibrated(kSampleUsedLayers);
  report.add_unused_layers("head.bn");
  v1::LayerReport* stem = report.add_layers();
  stem->set_name("stem.bn");
  stem->set_channels(8);
  stem->set_used(true);
  stem->set_excluded(true);
  for (int i = 0; i < kSampleUsedLayers; ++i) {
    v1::LayerReport* layer = report.add_layers();
    layer->set_name(i == 3 ? kHostileLayerName : "layer" + std::to_string(i) + ".bn");
    layer->set_channels(16 * (1 + i % 4));
    layer->set_used(true);
    layer->set_samples(1000 + i);
    layer->set_calls(25);
    layer->mutable_mean_shift_in_std()->set_min(0.01);
    layer->mutable_mean_shift_in_std()->set_median(SampleMaxShift(i) / 4);
    layer->mutable_mean_shift_in_std()->set_max(SampleMaxShift(i));
    layer->mutable_var_ratio()->set_min(0.25);
    layer->mutable_var_ratio()->set_median(1 + 0.01 * i);
    layer->mutable_var_ratio()->set_max(4);
    layer->set_rel_std_error(i == 5 ? 0.09 : i == 9 ? -1 : 0.001 * (i + 1));
    if (i == 7) layer->set_zero_var_channels(2);
  }
  v1::LayerReport* head = report.add_layers();
  head->set_name("head.bn");
  head->set_channels(4);
  for (int b = 2; b <= 25; ++b) {
    v1::ConvergencePoint* point = report.add_convergence();
    point->set_batches(b);
    point->set_samples(8 * b);
    point->set_max_rel_std_error(0.09 * std::pow(25.0 / b, 0.4));
    point->set_median_rel_std_error(0.011 * std::sqrt(25.0 / b));
    point->set_layers(kSampleUsedLayers - 1);
  }
  return report;
}

}  // namespace recal::testing
