// What the table of cases (data_spec_cases.json, data_spec_cases_test.cc) cannot say: the
// canonical spelling, and the list of schemes an unknown one is answered with.
#include "common/data_spec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recal::data {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(DataSpec, CanonicalSpecsAreSpelledAsTheyAre) {
  for (const char* spec : {
           "safetensors:/d/a:b.safetensors:",  // a trailing ':' for a ':' in the path
           "safetensors:s3://bucket/d/x.safetensors",  // none for the ':' of s3://
           "safetensors:s3://bucket/x.st:images,labels?scale=255",
           "safetensors:s3://bucket/a:b.st:",
           "safetensors:/d/x.st:images?scale=255&mean=0.5,0.25&std=0.2,0.1",
           "npy:/d/x.npy?scale=255",
           "torch:/d/what?.pt?",  // a trailing '?' for a '?' in the path
           "synthetic:10,seed=18446744073709551615",
       }) {
    absl::StatusOr<DataSpec> s = ParseDataSpec(spec);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(DataSpecToString(*s), spec);
  }
}

TEST(DataSpec, RejectsUnknownSchemeListingTheKnownOnes) {
  absl::StatusOr<DataSpec> s = ParseDataSpec("parquet:/x");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s.status()), HasSubstr("unknown scheme 'parquet'"));
  EXPECT_THAT(Message(s.status()), HasSubstr("synthetic:SHAPE[,seed=S]"));
}

}  // namespace
}  // namespace recal::data
