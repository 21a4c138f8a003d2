// Line plots as inline SVG, for the HTML report: no script, no external file, so the page
// works offline and shows the same in any browser.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace recal::ctl {

struct PlotSeries {
  std::string name;            // in the legend and the points' hover text
  std::string color;           // a CSS colour chosen by the caller (never from a report)
  std::vector<double> values;  // one per x position; NaN (or <= 0 on a log scale): no point
};

struct LinePlot {
  std::string id;  // the <svg> element's id
  std::string title;
  std::string y_label;
  std::string x_label;
  bool log_y = false;
  std::vector<std::string> x_names;  // per x position, in the points' hover text
  std::vector<PlotSeries> series;
  std::optional<double> guide;  // a dashed horizontal line at this y
  // Per x position, where it lies on the x axis (ticks at round values of it); empty: the
  // positions are evenly spaced and the ticks are their indices.
  std::vector<double> x_values;
  bool log_x = false;  // x_values on a log scale (each must be > 0)
};

// One <svg class="plot"> element. Each series is a <g class="series" data-series=NAME
// data-points=N>: a <polyline> per run of consecutive values (a missing value breaks the
// line) and a <circle> per value, titled "x name: series value" for hovering. Every string
// from `plot` is escaped.
std::string SvgLinePlot(const LinePlot& plot);

}  // namespace recal::ctl
