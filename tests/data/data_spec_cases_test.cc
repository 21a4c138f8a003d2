// ParseDataSpec against every case of tests/data/data_spec_cases.json, the table of the
// data-spec grammar that the Python client's parser is tested against too
// (tests/python_client/test_data_specs.py).
#include <charconv>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data_spec.h"
#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace recal::data {
namespace {

namespace pb = google::protobuf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

absl::Status BadTable(absl::string_view why) {
  return absl::FailedPreconditionError(absl::StrCat(RECAL_DATA_SPEC_CASES, ": ", why));
}

absl::StatusOr<std::vector<pb::Struct>> LoadCases() {
  std::ifstream in(RECAL_DATA_SPEC_CASES);
  if (!in) return BadTable("cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  pb::Struct table;
  if (auto parsed = pb::util::JsonStringToMessage(text.str(), &table); !parsed.ok()) {
    return BadTable(absl::StrCat("not JSON: ", std::string(parsed.message())));
  }
  const auto cases = table.fields().find("cases");
  if (cases == table.fields().end() || !cases->second.has_list_value()) return BadTable("no \"cases\" list");
  std::vector<pb::Struct> out;
  for (const pb::Value& value : cases->second.list_value().values()) {
    if (!value.has_struct_value()) return BadTable("a case that is not an object");
    out.push_back(value.struct_value());
  }
  return out;
}

// Each name of `fields` is one of `known`.
absl::Status OnlyKnownFields(const pb::Struct& fields, const std::set<std::string>& known) {
  for (const auto& [name, value] : fields.fields()) {
    if (known.count(name) == 0) return BadTable(absl::StrCat("unknown field \"", name, "\""));
  }
  return absl::OkStatus();
}

// An integer as the table writes it: a JSON number below 2^53, or decimal digits in a string.
template <typename Int>
absl::StatusOr<Int> Integer(const pb::Value& value) {
  Int out = 0;
  if (value.has_string_value()) {
    if (!absl::SimpleAtoi(value.string_value(), &out)) return BadTable(absl::StrCat("'", value.string_value(), "' is not an integer"));
    return out;
  }
  const double number = value.number_value();
  if (!value.has_number_value() || number != std::floor(number) || std::fabs(number) >= 0x1p53) {
    return BadTable(absl::StrCat(value.ShortDebugString(), " is not an integer below 2^53 (write larger ones as strings)"));
  }
  return static_cast<Int>(number);
}

template <typename T>
absl::StatusOr<std::vector<T>> List(const pb::Value& value) {
  if (!value.has_list_value()) return BadTable(absl::StrCat(value.ShortDebugString(), " is not a list"));
  std::vector<T> out;
  for (const pb::Value& item : value.list_value().values()) {
    if constexpr (std::is_same_v<T, std::string>) {
      if (!item.has_string_value()) return BadTable(absl::StrCat(item.ShortDebugString(), " is not a string"));
      out.push_back(item.string_value());
    } else if constexpr (std::is_same_v<T, double>) {
      if (!item.has_number_value()) return BadTable(absl::StrCat(item.ShortDebugString(), " is not a number"));
      out.push_back(item.number_value());
    } else {
      RECAL_ASSIGN_OR_RETURN(T v, Integer<T>(item));
      out.push_back(v);
    }
  }
  return out;
}

absl::StatusOr<DataSpec::Scheme> SchemeNamed(const std::string& name) {
  if (name == "npy") return DataSpec::Scheme::kNpy;
  if (name == "safetensors") return DataSpec::Scheme::kSafetensors;
  if (name == "torch") return DataSpec::Scheme::kTorch;
  if (name == "synthetic") return DataSpec::Scheme::kSynthetic;
  if (name == "images") return DataSpec::Scheme::kImages;
  return BadTable(absl::StrCat("unknown scheme \"", name, "\""));
}

absl::Status SetField(const std::string& name, const pb::Value& value, DataSpec& out) {
  if (name == "scheme") {
    RECAL_ASSIGN_OR_RETURN(out.scheme, SchemeNamed(value.string_value()));
  } else if (name == "path") {
    out.path = value.string_value();
  } else if (name == "keys") {
    RECAL_ASSIGN_OR_RETURN(out.keys, List<std::string>(value));
  } else if (name == "shape") {
    RECAL_ASSIGN_OR_RETURN(out.sample_shape, List<int64_t>(value));
  } else if (name == "seed") {
    RECAL_ASSIGN_OR_RETURN(out.seed, Integer<uint64_t>(value));
  } else if (name == "resize") {
    RECAL_ASSIGN_OR_RETURN(out.resize, Integer<int64_t>(value));
  } else if (name == "crop") {
    RECAL_ASSIGN_OR_RETURN(out.crop, Integer<int64_t>(value));
  } else if (name == "mean") {
    RECAL_ASSIGN_OR_RETURN(out.mean, List<double>(value));
  } else if (name == "std") {
    RECAL_ASSIGN_OR_RETURN(out.std, List<double>(value));
  } else if (name == "scale") {
    out.scale = value.number_value();
  } else if (name == "samples") {
    RECAL_ASSIGN_OR_RETURN(out.samples, Integer<int64_t>(value));
  } else if (name == "shuffle") {
    out.shuffle = value.bool_value();
  } else if (name == "on_bad") {
    if (value.string_value() != "fail" && value.string_value() != "skip") return BadTable("on_bad is fail or skip");
    out.skip_bad = value.string_value() == "skip";
  } else {
    return BadTable(absl::StrCat("unknown field \"", name, "\" in means"));
  }
  return absl::OkStatus();
}

// What a case's "means" says, the fields it leaves out at DataSpec's defaults.
absl::StatusOr<DataSpec> Meaning(const pb::Struct& means) {
  DataSpec out;
  for (const auto& [name, value] : means.fields()) RECAL_RETURN_IF_ERROR(SetField(name, value, out));
  return out;
}

std::string Number(double value) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof(text), value).ptr);
}

std::string Numbers(const std::vector<double>& values) {
  return absl::StrJoin(values, ",", [](std::string* out, double v) { out->append(Number(v)); });
}

// Every field, numbers in their shortest exact spelling: equal text, equal specs.
std::string Fields(const DataSpec& spec) {
  return absl::StrCat("scheme=", static_cast<int>(spec.scheme), " path='", spec.path, "' keys=[",
                      absl::StrJoin(spec.keys, ","), "] shape=[", absl::StrJoin(spec.sample_shape, "x"),
                      "] seed=", spec.seed, " resize=", spec.resize, " crop=", spec.crop, " mean=[",
                      Numbers(spec.mean), "] std=[", Numbers(spec.std), "] scale=", Number(spec.scale),
                      " samples=", spec.samples, " shuffle=", spec.shuffle ? 1 : 0,
                      " skip_bad=", spec.skip_bad ? 1 : 0);
}

// `spec` with the fields a case names as filled left out, then filled with ImageNet's.
absl::StatusOr<DataSpec> RefilledWithImageNetDefaults(DataSpec spec, const pb::Value& filled) {
  RECAL_ASSIGN_OR_RETURN(const std::vector<std::string> names, List<std::string>(filled));
  for (const std::string& name : names) {
    if (name == "resize") {
      spec.resize = 0;
    } else if (name == "crop") {
      spec.crop = 0;
    } else if (name == "mean") {
      spec.mean.clear();
    } else if (name == "std") {
      spec.std.clear();
    } else {
      return BadTable(absl::StrCat("filled names resize, crop, mean or std, not \"", name, "\""));
    }
  }
  FillImageNetDefaults(&spec);
  return spec;
}

class DataSpecCases : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::vector<pb::Struct>> cases = LoadCases();
    ASSERT_TRUE(cases.ok()) << cases.status();
    cases_ = *std::move(cases);
    std::set<std::string> specs;
    for (const pb::Struct& c : cases_) {
      ASSERT_TRUE(OnlyKnownFields(c, {"spec", "means", "filled", "refused", "note"}).ok()) << c.ShortDebugString();
      const auto& fields = c.fields();
      ASSERT_TRUE(fields.count("spec") && fields.at("spec").has_string_value()) << c.ShortDebugString();
      ASSERT_NE(fields.count("means"), fields.count("refused")) << "means or refused: " << c.ShortDebugString();
      ASSERT_TRUE(specs.insert(fields.at("spec").string_value()).second)
          << "twice in the table: " << fields.at("spec").string_value();
    }
  }

  std::vector<pb::Struct> cases_;
};

TEST_F(DataSpecCases, ParseDataSpecMeansWhatTheTableSays) {
  int checked = 0;
  for (const pb::Struct& c : cases_) {
    if (!c.fields().count("means")) continue;
    const std::string& spec = c.fields().at("spec").string_value();
    SCOPED_TRACE(spec);
    absl::StatusOr<DataSpec> expected = Meaning(c.fields().at("means").struct_value());
    ASSERT_TRUE(expected.ok()) << expected.status();
    absl::StatusOr<DataSpec> parsed = ParseDataSpec(spec);
    if (!parsed.ok()) {
      ADD_FAILURE() << "refused: " << parsed.status();
      continue;
    }
    EXPECT_EQ(Fields(*parsed), Fields(*expected));
    if (c.fields().count("filled")) {
      // What the table calls filled is ImageNet's: what the Python client leaves to the server.
      absl::StatusOr<DataSpec> refilled = RefilledWithImageNetDefaults(*expected, c.fields().at("filled"));
      ASSERT_TRUE(refilled.ok()) << refilled.status();
      EXPECT_EQ(Fields(*refilled), Fields(*expected)) << "not ImageNet's: " << c.fields().at("filled").ShortDebugString();
    }
    ++checked;
  }
  EXPECT_GE(checked, 50);
}

TEST_F(DataSpecCases, ParseDataSpecRefusesWhatTheTableRefusesSayingWhy) {
  int checked = 0;
  for (const pb::Struct& c : cases_) {
    if (!c.fields().count("refused")) continue;
    const std::string& spec = c.fields().at("spec").string_value();
    SCOPED_TRACE(spec);
    absl::StatusOr<DataSpec> parsed = ParseDataSpec(spec);
    if (parsed.ok()) {
      ADD_FAILURE() << "accepted as " << Fields(*parsed);
      continue;
    }
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), StartsWith(absl::StrCat("bad data spec '", spec, "': ")));
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.fields().at("refused").string_value()));
    ++checked;
  }
  EXPECT_GE(checked, 50);
}

}  // namespace
}  // namespace recal::data
