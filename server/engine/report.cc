#include "server/engine/report.h"

#include <cmath>

#include <ATen/ATen.h>

#include "common/json_numbers.h"
#include "common/atomic_file.h"
#include "google/protobuf/util/json_util.h"

namespace recal::engine {
namespace {

// Below this a channel's variance counts as zero: BatchNorm's eps (1e-5 by default) then
// decides its normalisation, not the data.
constexpr double kZeroVariance = 1e-12;

void Spread(const at::Tensor& values, v1::ChannelSpread* out) {
  if (values.numel() == 0) return;
  out->set_min(values.min().item<double>());
  out->set_median(values.median().item<double>());
  out->set_max(values.max().item<double>());
}

}  // namespace

void DescribeLayer(const Layer& layer, const at::Tensor& old_mean, const at::Tensor& old_var,
                   v1::Estimator estimator, int64_t forwards, v1::LayerReport* out) {
  out->set_name(layer.name);
  out->set_running_mean_key(layer.mean_key);
  out->set_running_var_key(layer.var_key);
  out->set_channels(layer.channels);
  out->set_excluded(layer.excluded);
  out->set_samples(layer.stats.samples());
  out->set_calls(layer.calls);
  out->set_calls_per_forward(forwards > 0 ? static_cast<double>(layer.calls) / forwards : 0);
  out->set_refined_calls(layer.refined_calls);
  out->set_used(layer.calls > 0);
  out->set_calls_without_variance(layer.stats.calls_without_variance());
  if (!layer.stats.has_estimate(estimator)) return;  // stored statistics kept

  at::Tensor mean = layer.stats.mean(estimator).cpu();
  at::Tensor var = layer.stats.var(estimator).cpu();
  at::Tensor previous_mean = old_mean.to(at::kDouble).cpu();
  at::Tensor previous_var = old_var.to(at::kDouble).cpu();
  at::Tensor live = var > kZeroVariance;
  out->set_zero_var_channels(var.numel() - live.sum().item<int64_t>());
  Spread(((mean - previous_mean).abs() / var.sqrt()).masked_select(live),
         out->mutable_mean_shift_in_std());
  Spread((var / previous_var).masked_select(previous_var > 0), out->mutable_var_ratio());
  const double rel = layer.stats.RelStdError();
  out->set_rel_std_error(std::isfinite(rel) ? rel : -1);
}

absl::Status WriteReportJson(const std::string& path, const v1::RunReport& report) {
  google::protobuf::util::JsonPrintOptions json;
  json.add_whitespace = true;
  json.always_print_primitive_fields = true;
  json.preserve_proto_field_names = true;
  std::string text;
  auto printed = google::protobuf::util::MessageToJsonString(report, &text, json);
  if (!printed.ok()) return absl::InternalError(std::string(printed.message()));
  return WriteFileAtomically(path, Int64FieldsAsNumbers(text, *v1::RunReport::descriptor()));
}

}  // namespace recal::engine
