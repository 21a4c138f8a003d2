// `recalctl report` on a terminal: the run's facts, then the layers that moved most as an
// aligned table, then any flagged layer the table left out.
#pragma once

#include <string>

#include "client/recalctl/report_summary.h"
#include "recal/v1/report.pb.h"

namespace recal::ctl {

std::string ReportText(const v1::RunReport& report, const ReportViewOptions& options);

}  // namespace recal::ctl
