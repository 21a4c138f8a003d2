// What recalctl prints, checked in process (no server, no subprocess, no LibTorch): JSON with
// 64-bit integers as numbers, the report's table (order, --top, flags), its HTML page and
// SVG plots, and the escaping of everything a report's author controls.
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/recalctl/html_escape.h"
#include "common/json_numbers.h"
#include "client/recalctl/output.h"
#include "client/recalctl/report_html.h"
#include "client/recalctl/report_summary.h"
#include "client/recalctl/report_text.h"
#include "client/recalctl/svg_plot.h"
#include "recal/v1/recal.pb.h"
#include "tests/client/sample_report.h"

namespace recal::testing {
namespace {

using ctl::LayerRow;
using ctl::ReportViewOptions;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

google::protobuf::Struct AsStruct(const std::string& json) {
  google::protobuf::Struct parsed;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  return parsed;
}

const google::protobuf::Value& At(const google::protobuf::Struct& s, const std::string& key) {
  return s.fields().at(key);
}

int Count(absl::string_view text, absl::string_view what) {
  int n = 0;
  for (size_t at = text.find(what); at != absl::string_view::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

std::vector<std::string> Names(const std::vector<LayerRow>& rows) {
  std::vector<std::string> names;
  for (const LayerRow& row : rows) names.push_back(row.layer->name());
  return names;
}

// ------------------------------------------------------------------------------ JSON

TEST(ModelTextTest, ShowsEachInputAsTheProgramWasExportedForIt) {
  v1::Model model;
  model.set_name("resnet");
  v1::ModelInput* x = model.add_inputs();
  x->set_name("x");
  x->set_dtype("float32");
  v1::DynamicSize* batch = x->add_dims()->mutable_dynamic();
  batch->set_symbol("s0");
  batch->set_coefficient(1);
  batch->set_min(1);
  for (int64_t size : {3, 224, 224}) x->add_dims()->set_fixed(size);
  EXPECT_THAT(ctl::ModelText(model), HasSubstr("\ninput: x: float32 [s0, 3, 224, 224]\n"));
}

TEST(ToJsonTest, Int64FieldsAreNumbersEnumsAreNamesAndNothingElseChanges) {
  v1::Job job;
  job.set_id("job-1");
  job.set_state(v1::SUCCEEDED);
  job.mutable_spec()->set_batch_size(8);
  job.mutable_spec()->set_model_id("a \"batchSize\": \"7\" in a string");  // digits in a string field stay
  (*job.mutable_spec()->mutable_labels())["samples"] = "123";              // a map's string value stays
  auto* shape = job.mutable_spec()->mutable_data()->mutable_synthetic()->mutable_sample_shape();
  shape->Add(3);
  shape->Add(224);
  job.mutable_spec()->mutable_data()->mutable_synthetic()->set_seed(-5);
  job.mutable_progress()->set_batches_done(9007199254740993);  // 2^53 + 1: a double would round it
  job.mutable_create_time()->set_seconds(1700000000);

  const std::string json = ctl::ToJson(job);
  const google::protobuf::Struct parsed = AsStruct(json);
  const auto& spec = At(parsed, "spec").struct_value();
  EXPECT_EQ(At(spec, "batchSize").kind_case(), google::protobuf::Value::kNumberValue) << json;
  EXPECT_EQ(At(spec, "batchSize").number_value(), 8);
  const auto& synthetic = At(At(spec, "data").struct_value(), "synthetic").struct_value();
  ASSERT_EQ(At(synthetic, "sampleShape").list_value().values_size(), 2);
  EXPECT_EQ(At(synthetic, "sampleShape").list_value().values(1).number_value(), 224);
  EXPECT_EQ(At(synthetic, "seed").number_value(), -5);
  EXPECT_EQ(At(At(spec, "labels").struct_value(), "samples").string_value(), "123");
  EXPECT_EQ(At(spec, "modelId").string_value(), job.spec().model_id());
  EXPECT_EQ(At(parsed, "state").string_value(), "SUCCEEDED");
  EXPECT_EQ(At(parsed, "createTime").string_value(),
            "2023-11-14T22:13:20Z");                                  // well-known types as protobuf prints them
  EXPECT_THAT(json, HasSubstr("\"batchesDone\": 9007199254740993"));  // exact, not rounded
  // And protobuf reads it back as the same message.
  v1::Job back;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &back).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(job, back));
}

TEST(ToJsonTest, ReportEnumsByNameInt64sAsNumbers) {
  const std::string json = ctl::ToJson(SampleReport());
  EXPECT_THAT(json, HasSubstr("\"estimator\": \"BATCH_AVERAGE\""));
  EXPECT_THAT(json, HasSubstr("\"samples\": 200"));
  EXPECT_THAT(json, HasSubstr("\"layersRecalibrated\": 20"));
  EXPECT_THAT(json, HasSubstr("\"channels\": 16"));  // in the repeated LayerReport messages
  EXPECT_THAT(json, Not(HasSubstr("\"channels\": \"")));
}

TEST(ToJsonTest, Unsigned64AndSnakeCaseNamesToo) {
  v1::DataSource source;
  source.mutable_image_folder()->set_seed(std::numeric_limits<uint64_t>::max());
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;  // as the server writes its report files
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(source, &json, options).ok());
  EXPECT_THAT(json, HasSubstr("\"seed\":\"18446744073709551615\""));
  EXPECT_THAT(Int64FieldsAsNumbers(json, *source.GetDescriptor()), HasSubstr("\"seed\":18446744073709551615"));
}

TEST(ToJsonTest, TextThatIsNotProtobufsJsonComesBackUnchanged) {
  const auto& type = *v1::Job::descriptor();
  for (const std::string& bad : {std::string("{\"spec\": {\"batchSize\": \"8\""), std::string("[1, 2]"),
                                 std::string("{\"id\": \"unterminated}"), std::string("")}) {
    EXPECT_EQ(Int64FieldsAsNumbers(bad, type), bad);
  }
}

TEST(ToJsonTest, EveryTruncationOfADocumentComesBackUnchanged) {
  // As protobuf prints it (64-bit integers quoted): every cut short of the closing brace is
  // malformed, and must come back as it was (the rewriter reads no byte past the end).
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(SampleReport(), &json, options).ok());
  const size_t closing = json.rfind('}');
  for (size_t length = 0; length < closing; ++length) {
    const std::string cut = json.substr(0, length);
    ASSERT_EQ(Int64FieldsAsNumbers(cut, *v1::RunReport::descriptor()), cut) << length;
  }
  EXPECT_NE(Int64FieldsAsNumbers(json, *v1::RunReport::descriptor()), json);
}

// ------------------------------------------------------------------------------ table

TEST(JobTextTest, AQueuedJobSaysWhyItWaitsUnderItsStateAndOthersSayNothing) {
  v1::Job job;
  job.set_id("job-1");
  job.set_state(v1::QUEUED);
  job.mutable_wait()->set_reason("1 job is ahead of it (by priority, then age); 1 job runs now");
  EXPECT_THAT(ctl::JobText(job),
              HasSubstr("id: job-1\nstate: QUEUED\nwaiting: 1 job is ahead of it (by priority, then age); "
                        "1 job runs now\nmodel: "));
  job.set_state(v1::RUNNING);
  job.clear_wait();
  EXPECT_THAT(ctl::JobText(job), Not(HasSubstr("waiting:")));
}

TEST(ReportTableTest, LayersAreSortedByLargestMeanShiftThenThoseWithoutStatistics) {
  const v1::RunReport report = SampleReport();  // the rows point into it
  const std::vector<LayerRow> rows = ctl::LayersByShift(report, {});
  ASSERT_EQ(rows.size(), static_cast<size_t>(kSampleLayers));
  EXPECT_EQ(rows[0].layer->name(), "layer17.bn");
  EXPECT_EQ(rows[1].layer->name(), "layer14.bn");
  for (size_t i = 1; i < kSampleUsedLayers; ++i) {
    EXPECT_GT(rows[i - 1].layer->mean_shift_in_std().max(), rows[i].layer->mean_shift_in_std().max()) << i;
  }
  EXPECT_EQ(rows[kSampleLayers - 2].layer->name(), "stem.bn");  // excluded: no new statistics
  EXPECT_EQ(rows[kSampleLayers - 1].layer->name(), "head.bn");  // never ran
}

TEST(ReportTableTest, TopCutsTheTableButNeverHidesAFlaggedLayer) {
  const v1::RunReport report = SampleReport();
  EXPECT_EQ(ctl::RowsToShow(report, {}).size(), 15u);  // the default
  ReportViewOptions top3;
  top3.top = 3;
  EXPECT_THAT(Names(ctl::RowsToShow(report, top3)), ElementsAre("layer17.bn", "layer14.bn", "layer11.bn"));
  ReportViewOptions all;
  all.top = 0;
  EXPECT_EQ(ctl::RowsToShow(report, all).size(), static_cast<size_t>(kSampleLayers));
  EXPECT_TRUE(ctl::FlaggedButNotShown(report, all).empty());
  // Out of the default 15: layer9.bn (no error estimate), stem.bn and head.bn.
  EXPECT_THAT(Names(ctl::FlaggedButNotShown(report, {})), ElementsAre("layer9.bn", "stem.bn", "head.bn"));
  // Top 3: the 9% rel.err of layer5.bn (6th) and layer7.bn's zero-variance channels too.
  EXPECT_THAT(Names(ctl::FlaggedButNotShown(report, top3)),
              ElementsAre("layer5.bn", "layer7.bn", "layer9.bn", "stem.bn", "head.bn"));
}

TEST(ReportTableTest, FlagsPointAtRowsWorthALook) {
  const v1::RunReport report = SampleReport();
  const auto flags_of = [&](const std::string& name, double threshold = 0.05) {
    ReportViewOptions options;
    options.warn_rel_error = threshold;
    for (const v1::LayerReport& layer : report.layers()) {
      if (layer.name() == name) return ctl::LayerFlags(layer, options);
    }
    ADD_FAILURE() << "no layer " << name;
    return std::vector<std::string>{};
  };
  EXPECT_THAT(flags_of("head.bn"), ElementsAre("unused"));
  EXPECT_THAT(flags_of("stem.bn"), ElementsAre("excluded"));
  EXPECT_THAT(flags_of("layer5.bn"), ElementsAre("rel.err > 5%"));
  EXPECT_THAT(flags_of("layer5.bn", 0.1), ElementsAre());                    // 9% is under a 10% threshold
  EXPECT_THAT(flags_of("layer4.bn", 0.004), ElementsAre("rel.err > 0.4%"));  // 0.5%
  EXPECT_THAT(flags_of("layer7.bn"), ElementsAre("2 zero-var channels"));
  EXPECT_THAT(flags_of("layer9.bn"), ElementsAre("1 call: no error estimate"));
  EXPECT_THAT(flags_of("layer0.bn"), ElementsAre());
}

TEST(ReportTableTest, TextHasTheHeaderThenTheRowsInShiftOrder) {
  ReportViewOptions top3;
  top3.top = 3;
  const std::string text = ctl::ReportText(SampleReport(), top3);
  for (const char* fact :
       {"model:      sha256:0123abcd (torchscript)\n", "estimator:  batch_average\n", "modules:    eval\n",
        "device:     cpu\n", "batch size: 8\n", "batches:    25\n", "samples:    200\n", "seconds:    2.50\n",
        "samples/s:  80.0\n", "layers:     20 recalibrated, 1 unused, 1 excluded\n",
        "rel.err:    25% after 2 batches, 9% after 25 (worst layer; median layer 1.1%)\n"}) {
    EXPECT_THAT(text, HasSubstr(fact));
  }
  EXPECT_THAT(text, HasSubstr("the 3 of 22 layers that moved most"));
  const size_t first = text.find("\nlayer17.bn "), second = text.find("\nlayer14.bn "),
               third = text.find("\nlayer11.bn ");
  ASSERT_NE(first, std::string::npos) << text;
  EXPECT_LT(first, second);
  EXPECT_LT(second, third);
  // Each table row: name, channels, 5 statistics, rel.err, samples (and the flags).
  std::vector<std::string> cells =
      absl::StrSplit(text.substr(first + 1, text.find('\n', first + 1) - first - 1), ' ', absl::SkipEmpty());
  EXPECT_THAT(cells, ElementsAre("layer17.bn", "32", "5", "20", "0.25", "1.17", "4", "1.8%", "1017"));
  EXPECT_THAT(text, HasSubstr("flagged, not in the table above:"));
  EXPECT_THAT(text, HasSubstr("rel.err > 5%"));
  v1::RunReport noisy = SampleReport();
  noisy.mutable_convergence(0)->set_max_rel_std_error(1.33);
  EXPECT_THAT(ctl::ReportText(noisy, top3), HasSubstr("rel.err:    133% after 2 batches"));
  const size_t head = text.find("\nhead.bn ");
  ASSERT_NE(head, std::string::npos);
  EXPECT_THAT(text.substr(head, text.find('\n', head + 1) - head), HasSubstr("unused"));
}

// ------------------------------------------------------------------------------ HTML

TEST(HtmlEscapeTest, EscapesMarkupQuotesAndControlCharacters) {
  EXPECT_EQ(ctl::HtmlEscape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  EXPECT_EQ(ctl::HtmlEscape(std::string("x\0y\x1b", 4)), "x\xEF\xBF\xBDy\xEF\xBF\xBD");
  EXPECT_EQ(ctl::HtmlEscape("layer1.0.bn1\tok\n"), "layer1.0.bn1\tok\n");
}

TEST(SvgPlotTest, MissingValuesBreakTheLineAndLogScalesDropNonPositiveValues) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ctl::LinePlot plot{"p", "title", "y", "x", false, {"a", "b", "c", "d", "e"}, {}};
  plot.series = {{"s", "#000", {1, 2, nan, 4, 5}}};
  const std::string linear = ctl::SvgLinePlot(plot);
  EXPECT_EQ(Count(linear, "<polyline"), 2);
  EXPECT_EQ(Count(linear, "<circle"), 4);
  EXPECT_THAT(linear, HasSubstr("data-points=\"4\""));
  EXPECT_THAT(linear, HasSubstr("<title>d: s 4</title>"));
  plot.log_y = true;
  plot.series[0].values = {0.01, 0, -1, 10, 100};
  const std::string log = ctl::SvgLinePlot(plot);
  EXPECT_EQ(Count(log, "<circle"), 3);
  EXPECT_EQ(Count(log, "<polyline"), 2);
  EXPECT_THAT(log, HasSubstr(">0.01</text>"));  // decades as ticks
  EXPECT_THAT(log, HasSubstr(">100</text>"));
}

TEST(SvgPlotTest, ManyDecadesGetAFewTicksAndNegativeValuesStayInTheFrame) {
  ctl::LinePlot plot{"p", "title", "y", "x", true, {"a", "b"}, {}};
  plot.series = {{"s", "#000", {1e-30, 1e30}}};  // a variance that was ~0 before
  const std::string log = ctl::SvgLinePlot(plot);
  EXPECT_LE(Count(log, "text-anchor=\"end\""), 9);  // the y ticks' labels
  EXPECT_GE(Count(log, "text-anchor=\"end\""), 5);
  plot.log_y = false;
  plot.series = {{"s", "#000", {-2, 3}}};
  const std::string linear = ctl::SvgLinePlot(plot);
  EXPECT_THAT(linear, HasSubstr(">-2</text>"));  // the axis reaches below zero
  EXPECT_THAT(linear, HasSubstr(">4</text>"));   // and up to the step above 3
  EXPECT_THAT(linear, Not(HasSubstr("y=\"-")));  // every grid line and label inside the picture
}

TEST(SvgPlotTest, XByValueOnALogScaleTicksAtRoundValuesAndSpacesPointsByValue) {
  ctl::LinePlot plot{"p", "title", "y", "x", true, {"a", "b", "c", "d"}, {}};
  plot.series = {{"s", "#000", {0.5, 0.2, 0.1, 0.05}}};
  plot.x_values = {2, 20, 200, 2000};
  plot.log_x = true;
  const std::string svg = ctl::SvgLinePlot(plot);
  // Three decades: x ticks at the powers of ten inside 2 .. 2000, none outside.
  const auto x_tick = [](const char* value) { return absl::StrCat("text-anchor=\"middle\">", value, "</text>"); };
  for (const char* tick : {"10", "100", "1000"}) EXPECT_THAT(svg, HasSubstr(x_tick(tick)));
  EXPECT_THAT(svg, Not(HasSubstr(x_tick("1"))));
  EXPECT_THAT(svg, Not(HasSubstr(x_tick("2"))));
  EXPECT_THAT(svg, Not(HasSubstr(x_tick("10000"))));
  // Equal ratios, equal distances: the points are 226.7 px apart, from the left edge to the right.
  EXPECT_THAT(svg, HasSubstr("points=\"64.0,"));
  EXPECT_THAT(svg, HasSubstr(" 290.7,"));
  EXPECT_THAT(svg, HasSubstr(" 517.3,"));
  EXPECT_THAT(svg, HasSubstr(" 744.0,"));
  // Less than two decades: 2 and 5 times the powers too.
  plot.x_values = {2, 3, 8, 30};
  const std::string narrow = ctl::SvgLinePlot(plot);
  for (const char* tick : {"2", "5", "10", "20"}) EXPECT_THAT(narrow, HasSubstr(x_tick(tick)));
  EXPECT_THAT(narrow, Not(HasSubstr(x_tick("50"))));
}

TEST(SvgPlotTest, EveryStringIsEscaped) {
  ctl::LinePlot plot{"\"id", "<b>title", "<y", "<x", false, {"<script>n"}, {}};
  plot.series = {{"<s>", "red\"", {1}}};
  const std::string svg = ctl::SvgLinePlot(plot);
  EXPECT_THAT(svg, Not(HasSubstr("<script")));
  EXPECT_THAT(svg, Not(HasSubstr("<b>")));
  EXPECT_THAT(svg, Not(HasSubstr("<s>")));
  EXPECT_THAT(svg, Not(HasSubstr("red\"")));
  EXPECT_THAT(svg, HasSubstr("&lt;script&gt;n: &lt;s&gt; 1"));
}

TEST(ReportHtmlTest, OnePageFourPlotsTheTableAndNothingExecutableOrRemote) {
  const std::string html = ctl::ReportHtml(SampleReport(), {}, "job <job-1>");
  EXPECT_EQ(Count(html, "<svg class=\"plot\""), 4);
  for (const char* id : {"id=\"mean-shift\"", "id=\"var-ratio\"", "id=\"rel-error\"", "id=\"convergence\""}) {
    EXPECT_THAT(html, HasSubstr(id));
  }
  // The convergence plot: worst and median layer and the 1/sqrt(n) line, a point per batch.
  EXPECT_EQ(Count(html, "data-points=\"24\""), 3);
  EXPECT_THAT(html, HasSubstr("<title>after 25 batches (200 samples, 19 layers): worst layer 0.09</title>"));
  // Every used, not excluded layer is a point; layer9.bn's missing error estimate is not.
  EXPECT_EQ(Count(html, "data-points=\"20\""), 5);          // shift max, median; ratio min, median, max
  EXPECT_EQ(Count(html, "data-points=\"19\""), 1);          // rel.err
  EXPECT_EQ(Count(html, "<tr class=\"flagged\">"), 2 + 3);  // in the table, and apart
  EXPECT_THAT(html, HasSubstr("content=\"default-src 'none'; style-src 'unsafe-inline'\""));
  EXPECT_THAT(html, HasSubstr("<title>recal report: job &lt;job-1&gt;</title>"));
  // The hostile name is text wherever it appears, never markup.
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, HasSubstr("layer3.bn&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;"));
  for (const char* remote : {"src=", "href=", "url(", "@import", "http:", "https:"}) {
    EXPECT_THAT(html, Not(HasSubstr(remote)));
  }
}

TEST(ReportHtmlTest, ConvergenceSectionSaysWhyAReportHasNoHistory) {
  v1::RunReport sharded = SampleReport();
  sharded.clear_convergence();
  sharded.set_shards(3);
  const std::string html = ctl::ReportHtml(sharded, {}, "job");
  EXPECT_EQ(Count(html, "<svg class=\"plot\""), 3);
  EXPECT_THAT(html, HasSubstr("No history: the batches ran in 3 shards"));
  EXPECT_THAT(ctl::ReportText(sharded, {}), HasSubstr("rel.err:    not recorded for a merge of shards\n"));
  v1::RunReport old = SampleReport();
  old.clear_convergence();
  EXPECT_THAT(ctl::ReportHtml(old, {}, "job"), HasSubstr("No history in this report"));
  EXPECT_THAT(ctl::ReportText(old, {}), Not(HasSubstr("\nrel.err:")));
}

}  // namespace
}  // namespace recal::testing
