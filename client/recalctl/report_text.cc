#include "client/recalctl/report_text.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace recal::ctl {
namespace {

// The columns' short names, spelled out once under the caption.
constexpr char kLegend[] =
    "  shift: |new - old mean| / new std over the channels (median, max); var: new var / old var\n"
    "  (min, median, max); rel.err: standard error of the new statistics relative to the std\n";

// Columns padded to their widest cell: text columns (the first and the last) to the left,
// numbers to the right; the last column is not padded, so no line ends in spaces.
std::string AlignedColumns(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string text;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const bool last = c + 1 == row.size();
      const std::string padding(last ? 0 : widths[c] - row[c].size(), ' ');
      const bool left = c == 0 || last;
      absl::StrAppend(&line, c == 0 ? "" : "  ", left ? row[c] + padding : padding + row[c]);
    }
    absl::StrAppend(&text, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return text;
}

std::string Header(const v1::RunReport& report) {
  std::vector<std::vector<std::string>> lines;
  for (const auto& [key, value] : HeaderFacts(report)) lines.push_back({key + ":", value});
  // Both columns are text: pad the keys, leave the values as they are.
  std::string text;
  size_t width = 0;
  for (const auto& line : lines) width = std::max(width, line[0].size());
  for (const auto& line : lines) {
    absl::StrAppend(&text, line[0], std::string(width - line[0].size() + 1, ' '), line[1], "\n");
  }
  return text;
}

std::string Caption(const v1::RunReport& report, size_t shown) {
  std::string text = shown == static_cast<size_t>(report.layers_size())
                         ? absl::StrCat("all ", shown, " layers, by largest mean shift:\n")
                         : absl::StrCat("the ", shown, " of ", report.layers_size(),
                                        " layers that moved most (--top N for more, --all for every layer):\n");
  return absl::StrCat(text, kLegend);
}

}  // namespace

std::string ReportText(const v1::RunReport& report, const ReportViewOptions& options) {
  std::string text = Header(report);
  const std::vector<LayerRow> rows = RowsToShow(report, options);
  absl::StrAppend(&text, "\n", Caption(report, rows.size()));
  std::vector<std::vector<std::string>> cells = {ColumnNames()};
  for (const LayerRow& row : rows) cells.push_back(RowCells(row));
  absl::StrAppend(&text, AlignedColumns(cells));
  const std::vector<LayerRow> hidden = FlaggedButNotShown(report, options);
  if (!hidden.empty()) {
    absl::StrAppend(&text, "\nflagged, not in the table above:\n");
    std::vector<std::vector<std::string>> flagged = {ColumnNames()};
    for (const LayerRow& row : hidden) flagged.push_back(RowCells(row));
    absl::StrAppend(&text, AlignedColumns(flagged));
  }
  return text;
}

}  // namespace recal::ctl
