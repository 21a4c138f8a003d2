#include "client/recalctl/svg_plot.h"

#include <algorithm>
#include <cmath>

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

  double X(size_t i) const {
    return points <= 1 ? (kLeft + kRight) / 2 : kLeft + (kRight - kLeft) * static_cast<double>(i) / (points - 1);
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

Scale ScaleFor(const LinePlot& plot) {
  Scale scale;
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

// Frame, y grid lines with their values, x ticks at about eight layer indices, axis labels.
std::string Axes(const LinePlot& plot, const Scale& scale) {
  std::string svg = "<g class=\"axes\">";
  // Grid lines from the bottom to the top of the frame, both included.
  for (double v = scale.low; v <= scale.high + scale.step / 2; v += scale.step) {
    absl::StrAppend(&svg, YTick(scale, scale.log_y ? std::pow(10, v) : v));
  }
  const size_t every = std::max<size_t>(1, (scale.points + 7) / 8);
  for (size_t i = 0; i < scale.points; i += every) {
    absl::StrAppend(&svg, "<text class=\"tick\" x=\"", Num(scale.X(i)), "\" y=\"", Num(kBottom + 16),
                    "\" text-anchor=\"middle\">", i, "</text>");
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

std::string Legend(const LinePlot& plot) {
  std::string svg = "<g class=\"legend\">";
  double x = kRight - 90.0 * plot.series.size();
  for (const PlotSeries& s : plot.series) {
    absl::StrAppend(&svg, "<line x1=\"", Num(x), "\" x2=\"", Num(x + 18),
                    "\" y1=\"18\" y2=\"18\" stroke-width=\"2\" stroke=\"", HtmlEscape(s.color), "\"/><text x=\"",
                    Num(x + 22), "\" y=\"22\">", HtmlEscape(s.name), "</text>");
    x += 90;
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
