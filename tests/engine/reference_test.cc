// Every fixture model and export variant (tests/fixtures/make_fixtures.py) against the
// independent float64 reference (tests/fixtures/reference.py), with both estimators, in
// both memory formats (auto is one of them).
#include <cstdlib>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "server/data/batch_source.h"
#include "server/engine/recalibration.h"
#include "tests/engine/test_util.h"
#include "tests/test_util.h"

namespace recal::engine {
namespace {

constexpr double kTolerance = 1e-5;

struct FixtureCase {
  std::string family, variant, model, data, population_ref, batch_average_ref;
  int64_t batch_size = 0;
  std::vector<std::string> unused;
  std::map<std::string, double> calls_per_forward;
};

std::string FixturesDir() {
  const char* dir = std::getenv("RECAL_FIXTURES");  // to point the test at other fixtures
  return dir ? dir : RECAL_FIXTURES_DIR;
}

std::vector<FixtureCase> LoadManifest() {
  std::vector<FixtureCase> cases;
  std::ifstream in(FixturesDir() + "/manifest.tsv");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = absl::StrSplit(line, '\t');
    if (f.size() < 9) continue;
    FixtureCase c;
    c.family = f[0];
    c.variant = f[1];
    c.model = FixturesDir() + "/" + f[2];
    c.data = f[3];
    c.batch_size = std::stoll(f[4]);
    c.population_ref = FixturesDir() + "/" + f[5];
    c.batch_average_ref = FixturesDir() + "/" + f[6];
    if (f[7] != "-") c.unused = absl::StrSplit(f[7], ',');
    if (f[8] != "-") {
      for (absl::string_view kv : absl::StrSplit(f[8], ',')) {
        std::pair<std::string, std::string> p = absl::StrSplit(kv, '=');
        c.calls_per_forward[p.first] = std::stod(p.second);
      }
    }
    cases.push_back(c);
  }
  return cases;
}

struct Param {
  FixtureCase fixture;
  v1::Estimator estimator;
  MemoryFormat memory_format;
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.fixture.family << "." << p.fixture.variant << " " << v1::Estimator_Name(p.estimator) << " "
      << MemoryFormatName(p.memory_format);
}

class ReferenceTest : public ::testing::TestWithParam<Param> {};

TEST_P(ReferenceTest, MatchesFloat64Reference) {
  const FixtureCase& c = GetParam().fixture;
  Options options;
  options.estimator = GetParam().estimator;
  options.memory_format = GetParam().memory_format;
  auto run = Recalibration::Create(c.model, options);
  ASSERT_TRUE(run.ok()) << run.status();
  auto source = data::OpenBatchSource(c.data, c.batch_size);
  ASSERT_TRUE(source.ok()) << source.status();
  absl::Status ran = (*run)->Run([&] { return (*source)->Next(); });
  ASSERT_TRUE(ran.ok()) << ran;

  recal::testing::TempDir tmp;
  const std::string out = tmp.File("bn.safetensors");
  ASSERT_TRUE((*run)->WriteBatchNormBuffers(out).ok());
  auto written = testing::ReadSafetensors(out);
  auto reference = testing::ReadSafetensors(
      options.estimator == v1::POPULATION ? c.population_ref : c.batch_average_ref);
  ASSERT_FALSE(reference.empty());
  EXPECT_EQ(written.size(), reference.size());
  EXPECT_LE(testing::WorstRelativeError(written, reference), kTolerance);

  v1::RunReport report = (*run)->Report();
  EXPECT_THAT(report.unused_layers(), ::testing::UnorderedElementsAreArray(c.unused));
  for (const auto& layer : report.layers()) {
    auto expected = c.calls_per_forward.find(layer.name());
    const double calls = expected == c.calls_per_forward.end() ? (layer.used() ? 1.0 : 0.0)
                                                               : expected->second;
    EXPECT_DOUBLE_EQ(layer.calls_per_forward(), calls) << layer.name();
  }
}

std::vector<Param> AllCases() {
  std::vector<Param> params;
  for (const FixtureCase& c : LoadManifest()) {
    for (MemoryFormat format : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
      params.push_back({c, v1::POPULATION, format});
      params.push_back({c, v1::BATCH_AVERAGE, format});
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ReferenceTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.fixture.family + "_" + info.param.fixture.variant +
                                  (info.param.estimator == v1::POPULATION ? "_population"
                                                                          : "_batch_average") +
                                  "_" + MemoryFormatName(info.param.memory_format);
                         });

TEST(ReferenceFixtures, ManifestIsThere) {
  EXPECT_GE(LoadManifest().size(), 40u) << "fixtures missing in " << FixturesDir();
}

}  // namespace
}  // namespace recal::engine
