// The per-layer numbers of the report (DESIGN.md §2).
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "recal/v1/report.pb.h"
#include "server/engine/collector.h"

namespace recal::engine {

// Fills `out` for `layer`, comparing its new statistics with the stored ones.
void DescribeLayer(const Layer& layer, const at::Tensor& old_mean, const at::Tensor& old_var,
                   v1::Estimator estimator, int64_t forwards, v1::LayerReport* out);

// The report as JSON (protobuf's JSON mapping with the proto field names), written atomically.
absl::Status WriteReportJson(const std::string& path, const v1::RunReport& report);

}  // namespace recal::engine
