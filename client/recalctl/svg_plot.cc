#include "client/recalctl/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/recalctl/html_escape.h"

namespace recal::ctl {
namespace {

// The drawing area inside the <svg>, in pixels; the margins hold the axes' labels.
constexpr double kWidth = 760, kHeight = 260;
constexpr double kLeft = 64, kRight = kWidth - 16, kTop = 30, kBottom = kHeight - 40;

bool Drawable(double value, bool log_y) { return std::isfinite(value) && (!log_y || value > 0); }

// Maps values to pixels; on a log scale the bounds are powers of ten.
struct Scale {
  bool log_y = false;
  double low = 0, high = 1;  // on a log scale: log10 of the bounds
  size_t points = 1;
  double step = 1;  // between grid lines: a value (linear), a number of decades (log)
  // x by value (LinePlot::x_values): the positions, log10 of them on a log scale, and their
  // range; empty: by index.
  std::vector<double> xs;
  bool log_x = false;
  double x_low = 0, x_high = 1;

  double X(size_t i) const {
    if (!xs.empty()) return i < xs.size() ? XAt(xs[i]) : kRight;
    return points <= 1 ? (kLeft + kRight) / 2 : kLeft + (kRight - kLeft) * static_cast<double>(i) / (points - 1);
  }
  // The pixel of a position on the axis (log10 of it on a log scale).
  double XAt(double position) const {
    return x_high > x_low ? kLeft + (kRight - kLeft) * (position - x_low) / (x_high - x_low) : (kLeft + kRight) / 2;
  }
  double Y(double value) const {
    const double v = log_y ? std::log10(value) : value;
    return kBottom - (kBottom - kTop) * (v - low) / (high - low);
  }
};

// 1, 2 or 5 times a power of ten: the tick step for about four steps over `range`.
double NiceStep(double range) {
  const double rough = range / 4;
  const double power = std::pow(10, std::floor(std::log10(rough)));
  for (double factor : {1.0, 2.0, 5.0}) {
    if (factor * power >= rough) return factor * power;
  }
  return 10 * power;
}

// Positions by value: finite ones (positive on a log scale); any other puts the point at
// the right edge rather than outside the frame.
void XScaleFor(const LinePlot& plot, Scale& scale) {
  if (plot.x_values.empty()) return;
  scale.log_x = plot.log_x;
  std::vector<double> drawable;
  for (double x : plot.x_values) {
    const bool ok = std::isfinite(x) && (!plot.log_x || x > 0);
    scale.xs.push_back(ok ? (plot.log_x ? std::log10(x) : x) : std::numeric_limits<double>::quiet_NaN());
    if (ok) drawable.push_back(scale.xs.back());
  }
  if (drawable.empty()) drawable = {0, 1};
  scale.x_low = *std::min_element(drawable.begin(), drawable.end());
  scale.x_high = *std::max_element(drawable.begin(), drawable.end());
  for (double& x : scale.xs) {
    if (std::isnan(x)) x = scale.x_high;
  }
}

Scale ScaleFor(const LinePlot& plot) {
  Scale scale;
  XScaleFor(plot, scale);
  scale.log_y = plot.log_y;
  scale.points = plot.x_names.size();
  for (const PlotSeries& s : plot.series) scale.points = std::max(scale.points, s.values.size());
  std::vector<double> all;
  for (const PlotSeries& s : plot.series) {
    for (double v : s.values) {
      if (Drawable(v, plot.log_y)) all.push_back(plot.log_y ? std::log10(v) : v);
    }
  }
  if (plot.guide && Drawable(*plot.guide, plot.log_y))
    all.push_back(plot.log_y ? std::log10(*plot.guide) : *plot.guide);
  if (all.empty()) all = {plot.log_y ? -1.0 : 0.0, 1.0};
  const double min = *std::min_element(all.begin(), all.end()), max = *std::max_element(all.begin(), all.end());
  if (plot.log_y) {
    scale.low = std::floor(min);
    scale.high = std::max(std::ceil(max), scale.low + 1);  // at least one decade
    // Every decade, or every k-th where there are many (a variance that was near zero
    // before gives ratios of 1e30): about eight grid lines at most.
    scale.step = std::max(1.0, std::ceil((scale.high - scale.low) / 8));
    scale.high = scale.low + std::ceil((scale.high - scale.low) / scale.step) * scale.step;
  } else {
    // From 0 (lower only for a negative value): the linear plots show magnitudes, which are
    // read against zero.
    const double low = std::min(0.0, min), high = std::max(0.0, max);
    scale.step = NiceStep(high > low ? high - low : 1);
    scale.low = std::floor(low / scale.step) * scale.step;
    scale.high = std::max(std::ceil(high / scale.step) * scale.step, scale.low + scale.step);
  }
  return scale;
}

std::string Num(double v) { return absl::StrFormat("%.1f", v); }

std::string YTick(const Scale& scale, double value) {
  const double y = scale.Y(value);
  return absl::StrCat("<line class=\"grid\" stroke=\"#e4e4e4\" x1=\"", Num(kLeft), "\" x2=\"", Num(kRight), "\" y1=\"",
                      Num(y), "\" y2=\"", Num(y), "\"/><text class=\"tick\" x=\"", Num(kLeft - 6), "\" y=\"",
                      Num(y + 4), "\" text-anchor=\"end\">", absl::StrFormat("%g", value), "</text>");
}

std::string XTick(double x, double value) {
  return absl::StrCat("<text class=\"tick\" x=\"", Num(x), "\" y=\"", Num(kBottom + 16), "\" text-anchor=\"middle\">",
                      absl::StrFormat("%g", value), "</text>");
}

// The round values inside the x range: 1, 2, 5 times powers of ten on a log scale (only the
// powers where the range spans more than two decades), NiceStep's multiples on a linear one.
std::vector<double> XTickValues(const Scale& scale) {
  std::vector<double> ticks;
  const double slack = 1e-9 * std::max(1.0, scale.x_high - scale.x_low);
  const auto inside = [&](double position) {
    return position >= scale.x_low - slack && position <= scale.x_high + slack;
  };
  if (scale.log_x) {
    const bool sparse = scale.x_high - scale.x_low > 2;
    for (double decade = std::floor(scale.x_low); decade <= std::ceil(scale.x_high); ++decade) {
      for (double factor : {1.0, 2.0, 5.0}) {
        if (sparse && factor != 1.0) continue;
        const double value = factor * std::pow(10, decade);
        if (inside(std::log10(value))) ticks.push_back(value);
      }
    }
    return ticks;
  }
  const double step = NiceStep(scale.x_high > scale.x_low ? scale.x_high - scale.x_low : 1);
  for (double v = std::ceil((scale.x_low - slack) / step) * step; inside(v); v += step) ticks.push_back(v);
  return ticks;
}

// Frame, y grid lines with their values, x ticks at about eight layer indices (or round x
// values), axis labels.
std::string Axes(const LinePlot& plot, const Scale& scale) {
  std::string svg = "<g class=\"axes\">";
  // Grid lines from the bottom to the top of the frame, both included.
  for (double v = scale.low; v <= scale.high + scale.step / 2; v += scale.step) {
    absl::StrAppend(&svg, YTick(scale, scale.log_y ? std::pow(10, v) : v));
  }
  if (!scale.xs.empty()) {
    for (double value : XTickValues(scale)) {
      absl::StrAppend(&svg, XTick(scale.XAt(scale.log_x ? std::log10(value) : value), value));
    }
  }
  const size_t every = std::max<size_t>(1, (scale.points + 7) / 8);
  for (size_t i = 0; scale.xs.empty() && i < scale.points; i += every) {
    absl::StrAppend(&svg, XTick(scale.X(i), static_cast<double>(i)));
  }
  absl::StrAppend(&svg, "<rect class=\"frame\" fill=\"none\" stroke=\"#888\" x=\"", Num(kLeft), "\" y=\"", Num(kTop),
                  "\" width=\"", Num(kRight - kLeft), "\" height=\"", Num(kBottom - kTop), "\"/>");
  absl::StrAppend(&svg, "<text class=\"label\" x=\"", Num((kLeft + kRight) / 2), "\" y=\"", Num(kHeight - 6),
                  "\" text-anchor=\"middle\">", HtmlEscape(plot.x_label), "</text>");
  absl::StrAppend(&svg, "<text class=\"label\" transform=\"translate(14 ", Num((kTop + kBottom) / 2),
                  ") rotate(-90)\" text-anchor=\"middle\">", HtmlEscape(plot.y_label), "</text>");
  if (plot.guide && Drawable(*plot.guide, scale.log_y)) {
    const double y = scale.Y(*plot.guide);
    absl::StrAppend(&svg, "<line class=\"guide\" stroke=\"#444\" stroke-dasharray=\"4 3\" x1=\"", Num(kLeft),
                    "\" x2=\"", Num(kRight), "\" y1=\"", Num(y), "\" y2=\"", Num(y), "\"/>");
  }
  return svg + "</g>";
}

std::string Series(const LinePlot& plot, const PlotSeries& series, const Scale& scale) {
  std::string lines, dots, run;
  size_t count = 0;
  const auto end_run = [&] {
    if (!run.empty()) absl::StrAppend(&lines, "<polyline fill=\"none\" stroke-width=\"1.5\" points=\"", run, "\"/>");
    run.clear();
  };
  for (size_t i = 0; i < series.values.size(); ++i) {
    const double v = series.values[i];
    if (!Drawable(v, scale.log_y)) {
      end_run();
      continue;
    }
    ++count;
    const std::string x = Num(scale.X(i)), y = Num(scale.Y(v));
    absl::StrAppend(&run, run.empty() ? "" : " ", x, ",", y);
    const std::string name = i < plot.x_names.size() ? plot.x_names[i] : absl::StrCat(i);
    absl::StrAppend(&dots, "<circle cx=\"", x, "\" cy=\"", y, "\" r=\"2.5\"><title>", HtmlEscape(name), ": ",
                    HtmlEscape(series.name), " ", absl::StrFormat("%.4g", v), "</title></circle>");
  }
  end_run();
  return absl::StrCat("<g class=\"series\" data-series=\"", HtmlEscape(series.name), "\" data-points=\"", count,
                      "\" stroke=\"", HtmlEscape(series.color), "\" fill=\"", HtmlEscape(series.color), "\">", lines,
                      dots, "</g>");
}

// The legend's width for a series: its line, and its name at about 7 px a character (11 px
// sans-serif), at least the 90 px a short name always had.
double LegendWidth(const PlotSeries& series) { return std::max(90.0, 36.0 + 7.0 * series.name.size()); }

std::string Legend(const LinePlot& plot) {
  std::string svg = "<g class=\"legend\">";
  double x = kRight;
  for (const PlotSeries& s : plot.series) x -= LegendWidth(s);
  for (const PlotSeries& s : plot.series) {
    absl::StrAppend(&svg, "<line x1=\"", Num(x), "\" x2=\"", Num(x + 18),
                    "\" y1=\"18\" y2=\"18\" stroke-width=\"2\" stroke=\"", HtmlEscape(s.color), "\"/><text x=\"",
                    Num(x + 22), "\" y=\"22\">", HtmlEscape(s.name), "</text>");
    x += LegendWidth(s);
  }
  return svg + "</g>";
}

}  // namespace

std::string SvgLinePlot(const LinePlot& plot) {
  const Scale scale = ScaleFor(plot);
  std::string svg = absl::StrCat("<svg class=\"plot\" id=\"", HtmlEscape(plot.id), "\" viewBox=\"0 0 ", kWidth, " ",
                                 kHeight, "\" width=\"", kWidth, "\" height=\"", kHeight,
                                 "\" role=\"img\" aria-label=\"", HtmlEscape(plot.title), "\">");
  absl::StrAppend(&svg, "<text class=\"title\" x=\"", Num(kLeft), "\" y=\"20\">", HtmlEscape(plot.title), "</text>");
  absl::StrAppend(&svg, Axes(plot, scale), Legend(plot));
  for (const PlotSeries& series : plot.series) absl::StrAppend(&svg, Series(plot, series, scale));
  return svg + "</svg>\n";
}

}  // namespace recal::ctl
