// The report's HTML page in a real browser: headless Chromium (Debian's `chromium`) lays it
// out, and a probe script added to a copy of the page reads back what was drawn. Skipped,
// saying how to install it, where there is no chromium.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "client/recalctl/report_html.h"
#include "tests/client/sample_report.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

using ::testing::HasSubstr;

// $RECAL_CHROMIUM, or chromium / chromium-browser on PATH; empty if none.
std::string FindChromium() {
  if (const char* chosen = std::getenv("RECAL_CHROMIUM"); chosen != nullptr && *chosen != '\0') return chosen;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':', absl::SkipEmpty())) {
    for (const char* name : {"chromium", "chromium-browser"}) {
      const std::string candidate = absl::StrCat(dir, "/", name);
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  return "";
}

// Chromium's exit status and stdout for `page` (file://); killed by coreutils' timeout if it
// hangs.
std::pair<int, std::string> Chromium(const std::string& chromium, const TempDir& tmp, const std::string& page,
                                     const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {"120",
                                   chromium,
                                   "--headless",
                                   "--no-sandbox",
                                   "--disable-gpu",
                                   "--user-data-dir=" + tmp.File("profile"),
                                   "--window-size=1000,2000"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back("file://" + page);
  const Result run = RunBinary("timeout", argv);
  return {run.exit_code, run.out};
}

// Runs after the page has been parsed and laid out; writes one line per fact into a <pre>
// that --dump-dom prints. Sizes come from layout (getBBox), so an SVG the browser did not
// draw has none.
constexpr char kProbe[] = R"(<script>
const lines = [];
lines.push('title: ' + (document.title === 'recal report: sample' ? 'kept' : 'changed'));
lines.push('scripts: ' + document.scripts.length);
for (const svg of document.querySelectorAll('svg.plot')) {
  const box = svg.getBoundingClientRect();
  lines.push(`plot ${svg.id}: ${svg instanceof SVGSVGElement ? 'svg' : 'not-svg'} ${Math.round(box.width)}x${Math.round(box.height)}`);
  const view = svg.viewBox.baseVal;
  for (const g of svg.querySelectorAll('g.series')) {
    let points = 0, drawn = 0, inside = 0;
    for (const line of g.querySelectorAll('polyline')) {
      points += line.points.numberOfItems;
      const b = line.getBBox();
      if (b.width > 0 || line.points.numberOfItems < 2) drawn += 1;
    }
    const dots = g.querySelectorAll('circle');
    for (const dot of dots) {
      const b = dot.getBBox();
      if (b.width > 0 && b.x >= 0 && b.y >= 0 && b.x + b.width <= view.width && b.y + b.height <= view.height) inside += 1;
    }
    lines.push(`series ${svg.id}/${g.dataset.series}: points=${points} circles=${dots.length} inside=${inside} ` +
               `lines=${g.querySelectorAll('polyline').length} drawn=${drawn}`);
  }
}
const pre = document.createElement('pre');
pre.id = 'probe';
pre.textContent = lines.join('\n');
document.body.appendChild(pre);
</script>
)";

// The probe's "name: value" lines.
std::map<std::string, std::string> ProbeFacts(const std::string& dom) {
  std::map<std::string, std::string> facts;
  const size_t start = dom.find("<pre id=\"probe\">"), end = dom.find("</pre>", start);
  if (start == std::string::npos || end == std::string::npos) return facts;
  const std::string body = dom.substr(start + 16, end - start - 16);
  for (absl::string_view line : absl::StrSplit(body, '\n', absl::SkipEmpty())) {
    const std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(": ", 1));
    facts[parts[0]] = parts.size() > 1 ? parts[1] : "";
  }
  return facts;
}

std::string Fact(const std::map<std::string, std::string>& facts, const std::string& name) {
  const auto it = facts.find(name);
  return it == facts.end() ? "(the probe did not say)" : it->second;
}

class ReportPageInChromiumTest : public ::testing::Test {
 protected:
  void SetUp() override {
    chromium_ = FindChromium();
    if (chromium_.empty()) {
      GTEST_SKIP() << "no chromium on PATH (or RECAL_CHROMIUM): install it with "
                      "'apt-get install -y --no-install-recommends chromium' (scripts/debian-packages.txt)";
    }
    ctl::ReportViewOptions all;
    all.top = 0;
    html_ = ctl::ReportHtml(report_, all, "sample");
    page_ = tmp_.File("report.html");
    WriteBytes(page_, html_);
  }

  std::string chromium_;
  TempDir tmp_;
  const v1::RunReport report_ = SampleReport();
  std::string html_, page_;
};

TEST_F(ReportPageInChromiumTest, ThePageAsWrittenParsesIntoFourPlotsAndTheTable) {
  const auto [status, dom] = Chromium(chromium_, tmp_, page_, {"--dump-dom"});
  ASSERT_EQ(status, 0) << dom;
  // The DOM the browser built: the markup survived parsing as elements, the hostile layer
  // name stayed text.
  EXPECT_THAT(dom, HasSubstr("<svg class=\"plot\" id=\"mean-shift\""));
  EXPECT_THAT(dom, HasSubstr("<svg class=\"plot\" id=\"convergence\""));
  size_t circles = 0;
  for (size_t at = dom.find("<circle"); at != std::string::npos; at = dom.find("<circle", at + 1)) ++circles;
  // layer9.bn has no rel.err; the convergence plot has three series.
  EXPECT_EQ(circles, 5u * kSampleUsedLayers + (kSampleUsedLayers - 1) + 3u * kSampleConvergencePoints);
  EXPECT_THAT(dom, HasSubstr("layer3.bn&lt;script&gt;document.title='pwned'&lt;/script&gt;"));
  EXPECT_EQ(dom.find("<script"), std::string::npos);
}

TEST_F(ReportPageInChromiumTest, EveryPlotIsLaidOutWithAPointPerLayer) {
  // A copy with the probe, and without the page's policy (which forbids any script, the probe
  // too): so the hostile name would run here if it were not escaped.
  const std::string policy =
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n";
  ASSERT_THAT(html_, HasSubstr(policy));
  const std::string probed = tmp_.File("probed.html");
  WriteBytes(probed, absl::StrReplaceAll(html_, {{policy, ""}, {"</body>", std::string(kProbe) + "</body>"}}));
  const auto [status, dom] = Chromium(chromium_, tmp_, probed, {"--dump-dom"});
  ASSERT_EQ(status, 0) << dom;
  const std::map<std::string, std::string> facts = ProbeFacts(dom);
  ASSERT_FALSE(facts.empty()) << "the probe wrote nothing:\n" << dom.substr(0, 3000);
  EXPECT_EQ(Fact(facts, "title"), "kept");  // the layer name's script never ran
  EXPECT_EQ(Fact(facts, "scripts"), "1");   // the probe is the only script
  for (const char* plot : {"mean-shift", "var-ratio", "rel-error", "convergence"}) {
    EXPECT_EQ(Fact(facts, absl::StrCat("plot ", plot)), "svg 760x260") << plot;
  }
  const std::string every = absl::StrCat("points=", kSampleUsedLayers, " circles=", kSampleUsedLayers,
                                         " inside=", kSampleUsedLayers, " lines=1 drawn=1");
  for (const char* series :
       {"mean-shift/max", "mean-shift/median", "var-ratio/min", "var-ratio/median", "var-ratio/max"}) {
    EXPECT_EQ(Fact(facts, absl::StrCat("series ", series)), every) << series;
  }
  // layer9.bn ran once (no estimate): the line breaks there, into two drawn runs.
  EXPECT_EQ(Fact(facts, "series rel-error/rel.err"), "points=19 circles=19 inside=19 lines=2 drawn=2");
  // A point per recorded batch, one unbroken line, every point inside the picture.
  const std::string history = absl::StrCat("points=", kSampleConvergencePoints, " circles=", kSampleConvergencePoints,
                                           " inside=", kSampleConvergencePoints, " lines=1 drawn=1");
  for (const char* series : {"convergence/worst layer", "convergence/median layer", "convergence/1/\u221an"}) {
    EXPECT_EQ(Fact(facts, absl::StrCat("series ", series)), history) << series;
  }
}

}  // namespace
}  // namespace recal::testing
