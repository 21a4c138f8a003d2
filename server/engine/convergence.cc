#include "server/engine/convergence.h"

#include <algorithm>
#include <cmath>

namespace recal::engine {

std::optional<v1::ConvergencePoint> ConvergencePointOf(int64_t batches, int64_t samples,
                                                       std::vector<double> layer_errors) {
  layer_errors.erase(std::remove_if(layer_errors.begin(), layer_errors.end(),
                                    [](double e) { return !std::isfinite(e) || e < 0; }),
                     layer_errors.end());
  if (layer_errors.empty()) return std::nullopt;
  std::sort(layer_errors.begin(), layer_errors.end());
  v1::ConvergencePoint point;
  point.set_batches(batches);
  point.set_samples(samples);
  point.set_median_rel_std_error(layer_errors[(layer_errors.size() - 1) / 2]);
  point.set_max_rel_std_error(layer_errors.back());
  point.set_layers(static_cast<int32_t>(layer_errors.size()));
  return point;
}

ConvergenceHistory::ConvergenceHistory(int capacity) : capacity_(std::max(capacity, 2)) {}

bool ConvergenceHistory::Wants(int64_t batches) const {
  return !abandoned_ && (points_.empty() || batches % stride_ == 0);
}

void ConvergenceHistory::Add(const v1::ConvergencePoint& point) {
  if (!Wants(point.batches())) return;
  points_.push_back(point);
  if (static_cast<int>(points_.size()) < capacity_) return;
  stride_ *= 2;
  // The first point stays (where the estimate began); of the rest, the multiples of the new
  // stride, as a run of that stride from the start would have kept.
  auto kept = std::remove_if(points_.begin() + 1, points_.end(),
                             [this](const v1::ConvergencePoint& p) { return p.batches() % stride_ != 0; });
  points_.erase(kept, points_.end());
}

void ConvergenceHistory::Abandon() {
  abandoned_ = true;
  points_.clear();
}

std::vector<v1::ConvergencePoint> ConvergenceHistory::Points(const std::optional<v1::ConvergencePoint>& last) const {
  std::vector<v1::ConvergencePoint> points = points_;
  if (!abandoned_ && last && last->batches() > last_batches()) points.push_back(*last);
  return points;
}

}  // namespace recal::engine
