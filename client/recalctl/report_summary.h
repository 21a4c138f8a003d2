// What `recalctl report` shows of a RunReport, shared by the text table (report_text.h) and
// the HTML page (report_html.h): the header's facts, the layers in the order they are shown,
// the flags that point at rows worth attention, and each cell's text.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "recal/v1/report.pb.h"

namespace recal::ctl {

struct ReportViewOptions {
  // Rows shown: the `top` layers that moved most; 0 shows all of them.
  int top = 15;
  // A layer whose relative standard error is above this is flagged: its new statistics are
  // noisier than that fraction of the channel's std (more data would settle them).
  double warn_rel_error = 0.05;
};

// One shown layer and why it deserves a look (empty: nothing to note). `layer` points into
// the RunReport the row was made from, which must outlive the row.
struct LayerRow {
  const v1::LayerReport* layer = nullptr;
  std::vector<std::string> flags;
};

// ("model", "sha256:..."), ("estimator", "population"), ...: the run as a whole, in order.
std::vector<std::pair<std::string, std::string>> HeaderFacts(const v1::RunReport& report);

// Why `layer` deserves a look: "unused" (never ran, old statistics kept), "excluded",
// "rel.err 7.1%" (above the threshold), "1 call: no error estimate", "3 zero-var channels".
std::vector<std::string> LayerFlags(const v1::LayerReport& layer, const ReportViewOptions& options);

// The layers sorted by their largest mean shift (in stds), descending; ties and layers
// without statistics (unused, excluded) keep report order, after the others.
std::vector<LayerRow> LayersByShift(const v1::RunReport& report, const ReportViewOptions& options);

// LayersByShift cut to options.top.
std::vector<LayerRow> RowsToShow(const v1::RunReport& report, const ReportViewOptions& options);

// Flagged layers that RowsToShow leaves out, in shift order: listed apart so that a
// warning is never hidden by --top.
std::vector<LayerRow> FlaggedButNotShown(const v1::RunReport& report, const ReportViewOptions& options);

// Whether the layer has new statistics to describe (it ran and was not excluded).
bool HasNewStatistics(const v1::LayerReport& layer);

// The table's columns, in order, and one row's cells ("-" where a layer has no value):
// layer, channels, the mean shift in stds (median and max over channels), the variance ratio
// new / old (min, median, max), rel.err (as a percentage), samples per channel, flags.
std::vector<std::string> ColumnNames();
std::vector<std::string> RowCells(const LayerRow& row);

}  // namespace recal::ctl
