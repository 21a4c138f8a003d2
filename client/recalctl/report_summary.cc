#include "client/recalctl/report_summary.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/report_facts.h"

namespace recal::ctl {
namespace {

// The unspecified values are the server's defaults; name what it ran.
std::string EstimatorName(v1::Estimator estimator) {
  return estimator == v1::BATCH_AVERAGE ? "batch_average" : "population";
}

std::string ModulesName(v1::ModuleMode modules) {
  if (modules == v1::MODULE_MODE_UNSPECIFIED) return "eval";
  return absl::AsciiStrToLower(v1::ModuleMode_Name(modules));
}

std::string BatchesFact(const v1::RunReport& report) {
  std::string text = absl::StrCat(report.batches());
  if (report.stopped_early()) absl::StrAppend(&text, " (stopped early: target_rel_error reached)");
  return text;
}

// A relative error as a percentage with two significant digits, whole percents from 100 up
// (a first batch's estimate can be 130%: not "1.3e+02%").
std::string Percent(double fraction) {
  const double percent = 100 * fraction;
  return percent >= 99.5 ? absl::StrFormat("%.0f%%", percent) : absl::StrFormat("%.2g%%", percent);
}

// How the estimate settled: the worst layer's error at the first and last recorded batch.
std::string ConvergenceFact(const v1::RunReport& report) {
  const auto& history = report.convergence();
  if (history.empty()) return report.shards() > 1 ? "not recorded for a merge of shards" : "";
  const v1::ConvergencePoint& first = history[0];
  const v1::ConvergencePoint& last = history[history.size() - 1];
  return absl::StrFormat("%s after %d batches, %s after %d (worst layer; median layer %s)",
                         Percent(first.max_rel_std_error()), first.batches(), Percent(last.max_rel_std_error()),
                         last.batches(), Percent(last.median_rel_std_error()));
}

// Shifts compare as numbers; a layer without statistics sorts after every layer with them.
double SortKey(const v1::LayerReport& layer) {
  const double shift = layer.mean_shift_in_std().max();
  return HasNewStatistics(layer) && std::isfinite(shift) ? shift : -1;
}

}  // namespace

bool HasNewStatistics(const v1::LayerReport& layer) { return layer.used() && !layer.excluded(); }

std::vector<std::pair<std::string, std::string>> HeaderFacts(const v1::RunReport& report) {
  int excluded = 0;
  for (const v1::LayerReport& layer : report.layers()) excluded += layer.excluded() ? 1 : 0;
  std::vector<std::pair<std::string, std::string>> facts = {
      {"model",
       report.model_format().empty() ? report.model() : absl::StrCat(report.model(), " (", report.model_format(), ")")},
      {"data", report.data()},
      {"estimator", EstimatorName(report.estimator())},
      {"modules", ModulesName(report.modules())},
      {"device", report.device()},
  };
  if (!report.compute_dtype().empty() || !report.memory_format().empty()) {
    facts.emplace_back("compute", absl::StrCat(report.compute_dtype().empty() ? "float32" : report.compute_dtype(),
                                               ", ", report.memory_format().empty() ? "auto" : report.memory_format()));
  }
  facts.emplace_back("batch size", absl::StrCat(report.batch_size()));
  facts.emplace_back("batches", BatchesFact(report));
  facts.emplace_back("samples", absl::StrCat(report.samples()));
  if (report.shards() > 1) facts.emplace_back("shards", absl::StrCat(report.shards()));
  if (report.skipped_files() > 0) facts.emplace_back("skipped files", absl::StrCat(report.skipped_files()));
  facts.emplace_back("seconds", absl::StrFormat("%.2f", report.seconds()));
  facts.emplace_back("samples/s", absl::StrFormat("%.1f", report.samples_per_second()));
  facts.emplace_back("layers", absl::StrCat(report.layers_recalibrated(), " recalibrated, ",
                                            report.unused_layers_size(), " unused, ", excluded, " excluded"));
  if (std::string convergence = ConvergenceFact(report); !convergence.empty()) {
    facts.emplace_back("rel.err", std::move(convergence));
  }
  if (std::string quantizers = QuantizersFact(report); !quantizers.empty()) {
    facts.emplace_back("quantizers", std::move(quantizers));
  }
  if (std::string passes = IterationsFact(report); !passes.empty()) facts.emplace_back("iterations", std::move(passes));
  if (std::string fold = FoldFact(report); !fold.empty()) facts.emplace_back("folded", std::move(fold));
  for (const std::string& note : report.notes()) facts.emplace_back("note", note);
  return facts;
}

std::vector<std::string> LayerFlags(const v1::LayerReport& layer, const ReportViewOptions& options) {
  if (layer.excluded()) return {"excluded"};
  if (!layer.used()) return {"unused"};
  std::vector<std::string> flags;
  if (layer.rel_std_error() < 0) {
    flags.push_back("1 call: no error estimate");
  } else if (layer.rel_std_error() > options.warn_rel_error) {
    flags.push_back(absl::StrFormat("rel.err > %.3g%%", 100 * options.warn_rel_error));
  }
  if (layer.zero_var_channels() > 0) {
    flags.push_back(
        absl::StrCat(layer.zero_var_channels(), " zero-var channel", layer.zero_var_channels() == 1 ? "" : "s"));
  }
  return flags;
}

std::vector<LayerRow> LayersByShift(const v1::RunReport& report, const ReportViewOptions& options) {
  std::vector<LayerRow> rows;
  rows.reserve(report.layers_size());
  for (const v1::LayerReport& layer : report.layers()) rows.push_back({&layer, LayerFlags(layer, options)});
  std::stable_sort(rows.begin(), rows.end(),
                   [](const LayerRow& a, const LayerRow& b) { return SortKey(*a.layer) > SortKey(*b.layer); });
  return rows;
}

std::vector<LayerRow> RowsToShow(const v1::RunReport& report, const ReportViewOptions& options) {
  std::vector<LayerRow> rows = LayersByShift(report, options);
  if (options.top > 0 && rows.size() > static_cast<size_t>(options.top)) rows.resize(options.top);
  return rows;
}

std::vector<LayerRow> FlaggedButNotShown(const v1::RunReport& report, const ReportViewOptions& options) {
  std::vector<LayerRow> rows = LayersByShift(report, options);
  const size_t shown = options.top > 0 ? std::min(rows.size(), static_cast<size_t>(options.top)) : rows.size();
  std::vector<LayerRow> flagged;
  for (size_t i = shown; i < rows.size(); ++i) {
    if (!rows[i].flags.empty()) flagged.push_back(rows[i]);
  }
  return flagged;
}

std::vector<std::string> ColumnNames() {
  return {"layer",   "channels", "shift.med", "shift.max", "var.min",
          "var.med", "var.max",  "rel.err",   "samples",   "flags"};
}

std::vector<std::string> RowCells(const LayerRow& row) {
  const v1::LayerReport& layer = *row.layer;
  std::vector<std::string> cells = {layer.name(), absl::StrCat(layer.channels())};
  if (HasNewStatistics(layer)) {
    const v1::ChannelSpread& shift = layer.mean_shift_in_std();
    const v1::ChannelSpread& ratio = layer.var_ratio();
    for (double value : {shift.median(), shift.max(), ratio.min(), ratio.median(), ratio.max()}) {
      cells.push_back(absl::StrFormat("%.3g", value));
    }
    cells.push_back(layer.rel_std_error() >= 0 ? Percent(layer.rel_std_error()) : "-");
  } else {
    cells.insert(cells.end(), 6, "-");
  }
  cells.push_back(absl::StrCat(layer.samples()));
  cells.push_back(absl::StrJoin(row.flags, ", "));
  return cells;
}

}  // namespace recal::ctl
