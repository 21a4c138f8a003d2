// `recalctl report --html FILE`: one self-contained page (inline CSS and SVG, no script, no
// fetch of anything; a Content-Security-Policy says so to the browser) with the run's facts,
// plots of the per-layer statistics across the network's depth, and the layer table.
#pragma once

#include <string>

#include "client/recalctl/report_summary.h"
#include "recal/v1/report.pb.h"

namespace recal::ctl {

// `source` names where the report came from ("job job-...", a file name), for the title.
std::string ReportHtml(const v1::RunReport& report, const ReportViewOptions& options, const std::string& source);

}  // namespace recal::ctl
