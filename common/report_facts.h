// Facts of a RunReport said the same way by recal-run and recalctl: its quantizers, how far
// each pass moved the statistics, and what the folded model folded.
//
// Header-only, as common/enum_names.h and for the same reason: recalctl carries the generated
// protobuf code as objects of its own.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "recal/v1/report.pb.h"

namespace recal {

// "12, frozen (8 observers held still)": the quantizers ran with the scales and zero points
// the model holds. Empty for a model without.
inline std::string QuantizersFact(const v1::RunReport& report) {
  if (!report.has_quantizers() || report.quantizers().count() == 0) return "";
  const v1::Quantizers& q = report.quantizers();
  return absl::StrCat(q.count(), ", frozen (", q.observers_frozen(), " observer",
                      q.observers_frozen() == 1 ? "" : "s", " held still)");
}

// "pass 1: 0.83 std / 45% (layer1.0.bn1); pass 2: 0.0021 std / 0.1% (...)": the worst channel's
// mean shift and variance change of each pass. Empty for a run of one pass.
inline std::string IterationsFact(const v1::RunReport& report) {
  std::string text;
  for (const v1::IterationStep& step : report.iterations()) {
    absl::StrAppend(&text, text.empty() ? "" : "; ",
                    absl::StrFormat("pass %d: %.2g std / %.2g%%", step.iteration(), step.max_mean_shift_in_std(),
                                    100 * step.max_var_change()),
                    step.worst_layer().empty() ? "" : absl::StrCat(" (", step.worst_layer(), ")"));
  }
  return text;
}

// Why a TorchScript model gets no folded model, said by the server at submit (where the
// upload's inspection says TorchScript), by recal-run and by the engine. LibTorch's pass for
// TorchScript (torch.jit's FoldConvBatchNorm) folds a convolution that is also called without
// its BatchNorm, changing that call's output (measured: 3.2 off on a small net), and asserts
// on such traced modules: Recal does not hand it on.
inline constexpr char kFoldNeedsExportedProgram[] =
    "a folded model is made of torch.export programs only: export the model with torch.export.export "
    "and save it with torch.export.save (TorchScript's own folding pass changes the output of a convolution "
    "that is also called without its BatchNorm)";

// "folded 52 BatchNorm layers into the layers before them; kept 1 in eval mode: 'bn2' (it
// follows relu, not a convolution or linear layer)". Empty without a folded model.
inline std::string FoldFact(const v1::RunReport& report) {
  if (!report.has_fold()) return "";
  const v1::BatchNormFold& fold = report.fold();
  std::string text = absl::StrCat("folded ", fold.folded_size(), " BatchNorm layer", fold.folded_size() == 1 ? "" : "s",
                                  " into the layers before them");
  if (fold.kept_size() == 0) return text;
  std::vector<std::string> kept;
  for (const v1::BatchNormFold::Kept& layer : fold.kept()) {
    kept.push_back(absl::StrCat("'", layer.name(), "' (", layer.reason(), ")"));
  }
  return absl::StrCat(text, "; kept ", fold.kept_size(), " in eval mode: ", absl::StrJoin(kept, ", "));
}

}  // namespace recal
