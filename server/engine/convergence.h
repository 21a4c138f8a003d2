// How the estimate settled as batches came in: a bounded history of the relative standard
// error after a batch, for the report's convergence plot. No LibTorch: it keeps numbers.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "recal/v1/report.pb.h"

namespace recal::engine {

// A long run keeps at most this many points (plus the last batch's): about 4 KB of report.
inline constexpr int kConvergencePoints = 128;

// The point after `batches` batches and `samples` samples, from each recalibrated layer's
// relative standard error (infinite where a layer has no estimate yet): the median (the
// lower middle value, as torch.median and the report's channel spreads) and the largest over
// the layers with an estimate. std::nullopt while no layer has one.
std::optional<v1::ConvergencePoint> ConvergencePointOf(int64_t batches, int64_t samples,
                                                       std::vector<double> layer_errors);

// Points at batches 1, 2, 3, ... until `capacity` are kept; then every other one is dropped
// (the first kept) and only every 2nd batch is wanted, then every 4th, and so on: the points
// stay evenly spread over the run, at most `capacity` of them, whatever its length.
class ConvergenceHistory {
 public:
  explicit ConvergenceHistory(int capacity = kConvergencePoints);

  // Whether the point after this batch would be kept (the caller computes it only then).
  bool Wants(int64_t batches) const;
  void Add(const v1::ConvergencePoint& point);
  // The statistics no longer grew batch by batch (shards merged): no history, from now on.
  void Abandon();
  bool abandoned() const { return abandoned_; }

  // The kept points, then `last` where it is later than the last kept: the run's final error.
  std::vector<v1::ConvergencePoint> Points(const std::optional<v1::ConvergencePoint>& last) const;
  int64_t last_batches() const { return points_.empty() ? 0 : points_.back().batches(); }

 private:
  int capacity_;
  int64_t stride_ = 1;
  bool abandoned_ = false;
  std::vector<v1::ConvergencePoint> points_;
};

}  // namespace recal::engine
