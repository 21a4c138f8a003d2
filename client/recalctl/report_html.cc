#include "client/recalctl/report_html.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/recalctl/html_escape.h"
#include "client/recalctl/svg_plot.h"

namespace recal::ctl {
namespace {

constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();
constexpr char kBlue[] = "#1f6fb4", kOrange[] = "#e07b16", kGreen[] = "#2e9a4a", kGrey[] = "#999999";

// No script may run and nothing may be fetched: a page built from an uploaded model's layer
// names stays inert even if an escape were missed somewhere.
constexpr char kHead[] = R"(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; }
td, th { padding: 2px 10px; text-align: left; }
table.layers td.num, table.layers th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.layers tr:nth-child(even) { background: #f4f6f8; }
tr.flagged td.flags { color: #b00020; font-weight: 600; }
svg.plot { display: block; margin: 0.5em 0 1.5em; font-size: 11px; }
svg.plot text.title { font-size: 13px; font-weight: 600; }
.note { color: #555; max-width: 60em; }
</style>
)";

// One value per layer in report order; kMissing where the layer has no new statistics.
template <typename Getter>
std::vector<double> PerLayer(const v1::RunReport& report, Getter value) {
  std::vector<double> values;
  for (const v1::LayerReport& layer : report.layers())
    values.push_back(HasNewStatistics(layer) ? value(layer) : kMissing);
  return values;
}

std::vector<LinePlot> Plots(const v1::RunReport& report, const ReportViewOptions& options) {
  std::vector<std::string> names;
  for (const v1::LayerReport& layer : report.layers()) names.push_back(layer.name());
  const std::string x_label = "BatchNorm layer, in report order (input \u2192 output)";
  LinePlot shift{"mean-shift", "Mean shift across depth", "|new - old mean| / new std", x_label, false, names, {}};
  shift.series = {{"max", kOrange, PerLayer(report, [](auto& l) { return l.mean_shift_in_std().max(); })},
                  {"median", kBlue, PerLayer(report, [](auto& l) { return l.mean_shift_in_std().median(); })}};
  LinePlot ratio{"var-ratio", "Variance ratio across depth (log scale)", "new var / old var", x_label, true, names, {}};
  ratio.series = {{"min", kGreen, PerLayer(report, [](auto& l) { return l.var_ratio().min(); })},
                  {"median", kBlue, PerLayer(report, [](auto& l) { return l.var_ratio().median(); })},
                  {"max", kOrange, PerLayer(report, [](auto& l) { return l.var_ratio().max(); })}};
  ratio.guide = 1;
  LinePlot error{
      "rel-error", "Relative standard error across depth (log scale)", "rel. std error", x_label, true, names, {}};
  // Negative: fewer than two calls, no estimate; left out of the plot.
  error.series = {{"rel.err", kBlue,
                   PerLayer(report, [](auto& l) { return l.rel_std_error() >= 0 ? l.rel_std_error() : kMissing; })}};
  error.guide = options.warn_rel_error;
  return {shift, ratio, error};
}

// The worst and the median layer's error after each recorded batch, on log-log axes, where
// an estimate that settles as more data comes in is a line of slope -1/2; the grey line is
// that slope through the final error, so a curve flatter than it stands out (batches that
// are not alike: sorted or drifting data).
LinePlot ConvergencePlot(const v1::RunReport& report, const ReportViewOptions& options) {
  LinePlot plot{"convergence", "Convergence over batches (log-log)", "rel. std error", "batches (log scale)",
                true, {}, {}};
  plot.log_x = true;
  PlotSeries worst{"worst layer", kOrange, {}}, median{"median layer", kBlue, {}}, ideal{"1/\u221an", kGrey, {}};
  const v1::ConvergencePoint& last = report.convergence(report.convergence_size() - 1);
  for (const v1::ConvergencePoint& point : report.convergence()) {
    plot.x_values.push_back(static_cast<double>(point.batches()));
    plot.x_names.push_back(absl::StrCat("after ", point.batches(), " batches (", point.samples(), " samples, ",
                                        point.layers(), " layers)"));
    worst.values.push_back(point.max_rel_std_error());
    median.values.push_back(point.median_rel_std_error());
    ideal.values.push_back(last.max_rel_std_error() *
                           std::sqrt(static_cast<double>(last.batches()) / static_cast<double>(point.batches())));
  }
  plot.series = {worst, median, ideal};
  plot.guide = options.warn_rel_error;
  return plot;
}

// The convergence section: the plot, or why there is none.
std::string ConvergenceSection(const v1::RunReport& report, const ReportViewOptions& options) {
  std::string html = "<h2>Convergence over batches</h2>\n<p class=\"note\">";
  if (report.convergence_size() == 0) {
    return absl::StrCat(html,
                        report.shards() > 1
                            ? absl::StrCat("No history: the batches ran in ", report.shards(),
                                           " shards whose statistics were merged at the end, so the estimate "
                                           "never grew in one order of batches.")
                            : "No history in this report (it was written by a Recal that did not record one).",
                        "</p>\n");
  }
  absl::StrAppend(&html,
                  "The relative standard error after each batch (thinned evenly in long runs): of the worst "
                  "layer (the progress line's rel.err) and of the median one. Grey: the 1/\u221an an estimate "
                  "settles by when its batches are alike, through the final error; dashed: the threshold of "
                  "the flags. Hover a point for its batch.</p>\n");
  return html + SvgLinePlot(ConvergencePlot(report, options));
}

std::string FactsTable(const v1::RunReport& report) {
  std::string html = "<table class=\"facts\">\n";
  for (const auto& [key, value] : HeaderFacts(report)) {
    absl::StrAppend(&html, "<tr><th>", HtmlEscape(key), "</th><td>", HtmlEscape(value), "</td></tr>\n");
  }
  return html + "</table>\n";
}

// The layer table; every column but the name and the flags holds numbers.
std::string LayerTable(const std::vector<LayerRow>& rows) {
  const std::vector<std::string> columns = ColumnNames();
  const auto numeric = [&](size_t c) { return c > 0 && c + 1 < columns.size(); };
  std::string html = "<table class=\"layers\">\n<thead><tr>";
  for (size_t c = 0; c < columns.size(); ++c) {
    absl::StrAppend(&html, numeric(c) ? "<th class=\"num\">" : "<th>", HtmlEscape(columns[c]), "</th>");
  }
  absl::StrAppend(&html, "</tr></thead>\n<tbody>\n");
  for (const LayerRow& row : rows) {
    const std::vector<std::string> cells = RowCells(row);
    absl::StrAppend(&html, row.flags.empty() ? "<tr>" : "<tr class=\"flagged\">");
    for (size_t c = 0; c < cells.size(); ++c) {
      const char* open = numeric(c) ? "<td class=\"num\">" : c + 1 == cells.size() ? "<td class=\"flags\">" : "<td>";
      absl::StrAppend(&html, open, HtmlEscape(cells[c]), "</td>");
    }
    absl::StrAppend(&html, "</tr>\n");
  }
  return html + "</tbody>\n</table>\n";
}

}  // namespace

std::string ReportHtml(const v1::RunReport& report, const ReportViewOptions& options, const std::string& source) {
  std::string html = kHead;
  absl::StrAppend(&html, "<title>recal report: ", HtmlEscape(source), "</title>\n</head>\n<body>\n");
  absl::StrAppend(&html, "<h1>BatchNorm recalibration report</h1>\n<p class=\"note\">", HtmlEscape(source), "</p>\n",
                  FactsTable(report));
  absl::StrAppend(&html,
                  "<h2>Across the network's depth</h2>\n<p class=\"note\">One point per BatchNorm layer "
                  "that got new statistics; gaps are layers that did not (unused or excluded). Hover a "
                  "point for the layer's name. Dashed lines: variance ratio 1 (unchanged), and the "
                  "relative-error threshold of the flags.</p>\n");
  for (const LinePlot& plot : Plots(report, options)) absl::StrAppend(&html, SvgLinePlot(plot));
  absl::StrAppend(&html, ConvergenceSection(report, options));
  const std::vector<LayerRow> rows = RowsToShow(report, options);
  absl::StrAppend(&html, "<h2>Layers that moved most</h2>\n<p class=\"note\">", rows.size(), " of ",
                  report.layers_size(), " layers, by largest mean shift.</p>\n", LayerTable(rows));
  const std::vector<LayerRow> hidden = FlaggedButNotShown(report, options);
  if (!hidden.empty()) absl::StrAppend(&html, "<h2>Flagged, not in the table above</h2>\n", LayerTable(hidden));
  return html + "</body>\n</html>\n";
}

}  // namespace recal::ctl
