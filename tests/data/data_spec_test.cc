#include "common/data_spec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recal::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Scheme = DataSpec::Scheme;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(DataSpec, ParsesFileSchemes) {
  absl::StatusOr<DataSpec> s = ParseDataSpec("npy:/data/x.npy");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->scheme, Scheme::kNpy);
  EXPECT_EQ(s->path, "/data/x.npy");
  s = ParseDataSpec("torch:rel/x.pt");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->scheme, Scheme::kTorch);
  EXPECT_EQ(s->path, "rel/x.pt");
}

TEST(DataSpec, ParsesSafetensorsKeys) {
  absl::StatusOr<DataSpec> s = ParseDataSpec("safetensors:/d/x.safetensors");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->path, "/d/x.safetensors");
  EXPECT_TRUE(s->keys.empty());
  s = ParseDataSpec("safetensors:/d/x.safetensors:images,labels");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->path, "/d/x.safetensors");
  EXPECT_THAT(s->keys, ElementsAre("images", "labels"));
}

TEST(DataSpec, TrailingColonAllowsColonsInSafetensorsPath) {
  absl::StatusOr<DataSpec> s = ParseDataSpec("safetensors:/d/a:b.safetensors:");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->path, "/d/a:b.safetensors");
  EXPECT_TRUE(s->keys.empty());
  EXPECT_EQ(DataSpecToString(*s), "safetensors:/d/a:b.safetensors:");
}

TEST(DataSpec, S3UrlColonIsNotTheKeySeparator) {
  absl::StatusOr<DataSpec> s = ParseDataSpec("safetensors:s3://bucket/d/x.safetensors");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->path, "s3://bucket/d/x.safetensors");
  EXPECT_TRUE(s->keys.empty());
  EXPECT_EQ(DataSpecToString(*s), "safetensors:s3://bucket/d/x.safetensors");
  s = ParseDataSpec("safetensors:s3://bucket/x.st:images,labels?scale=255");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->path, "s3://bucket/x.st");
  EXPECT_EQ(s->keys, (std::vector<std::string>{"images", "labels"}));
  EXPECT_EQ(DataSpecToString(*s), "safetensors:s3://bucket/x.st:images,labels?scale=255");
  // A key with ':' in the object's name: a trailing ':' as for local paths.
  s = ParseDataSpec("safetensors:s3://bucket/a:b.st:");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->path, "s3://bucket/a:b.st");
  EXPECT_EQ(DataSpecToString(*s), "safetensors:s3://bucket/a:b.st:");
  s = ParseDataSpec("npy:s3://bucket/x.npy?mean=1&std=2");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->path, "s3://bucket/x.npy");
  s = ParseDataSpec("images:s3://bucket/imgs/?resize=8&crop=4&mean=0,0,0&std=1,1,1");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->path, "s3://bucket/imgs/");
}

TEST(DataSpec, ParsesTensorFileNormalization) {
  absl::StatusOr<DataSpec> s = ParseDataSpec("safetensors:/d/x.st:images?scale=255&mean=0.5,0.25&std=0.2,0.1");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->path, "/d/x.st");
  EXPECT_THAT(s->keys, ElementsAre("images"));
  EXPECT_EQ(s->scale, 255);
  EXPECT_THAT(s->mean, ElementsAre(0.5, 0.25));
  EXPECT_THAT(s->std, ElementsAre(0.2, 0.1));
  EXPECT_EQ(DataSpecToString(*s), "safetensors:/d/x.st:images?scale=255&mean=0.5,0.25&std=0.2,0.1");
  s = ParseDataSpec("npy:/d/x.npy?scale=255");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->path, "/d/x.npy");
  EXPECT_TRUE(s->mean.empty());
  EXPECT_EQ(DataSpecToString(*s), "npy:/d/x.npy?scale=255");
}

TEST(DataSpec, TrailingQuestionMarkAllowsQuestionMarksInPaths) {
  absl::StatusOr<DataSpec> s = ParseDataSpec("torch:/d/what?.pt?");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->path, "/d/what?.pt");
  EXPECT_EQ(DataSpecToString(*s), "torch:/d/what?.pt?");
}

TEST(DataSpec, RejectsBadNormalization) {
  EXPECT_THAT(Message(ParseDataSpec("npy:/x.npy?mean=0.5").status()), HasSubstr("give both"));
  EXPECT_THAT(Message(ParseDataSpec("npy:/x.npy?mean=0.5&std=0").status()), HasSubstr("positive"));
  EXPECT_THAT(Message(ParseDataSpec("npy:/x.npy?scale=-1").status()), HasSubstr("scale"));
  EXPECT_THAT(Message(ParseDataSpec("npy:/x.npy?resize=3").status()), HasSubstr("unknown option 'resize'"));
  EXPECT_THAT(Message(ParseDataSpec("npy:/x.npy?scale=2&scale=3").status()), HasSubstr("repeated"));
  EXPECT_THAT(Message(ParseDataSpec("npy:?scale=2").status()), HasSubstr("empty path"));
}

TEST(DataSpec, ParsesSyntheticShapeAndSeed) {
  absl::StatusOr<DataSpec> s = ParseDataSpec("synthetic:3x224x224");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->scheme, Scheme::kSynthetic);
  EXPECT_THAT(s->sample_shape, ElementsAre(3, 224, 224));
  EXPECT_EQ(s->seed, 0u);
  s = ParseDataSpec("synthetic:10,seed=18446744073709551615");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(s->sample_shape, ElementsAre(10));
  EXPECT_EQ(s->seed, 18446744073709551615u);
  EXPECT_EQ(DataSpecToString(*s), "synthetic:10,seed=18446744073709551615");
}

TEST(DataSpec, RejectsUnknownSchemeListingTheKnownOnes) {
  absl::StatusOr<DataSpec> s = ParseDataSpec("parquet:/x");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s.status()), HasSubstr("unknown scheme 'parquet'"));
  EXPECT_THAT(Message(s.status()), HasSubstr("synthetic:SHAPE[,seed=S]"));
  EXPECT_THAT(Message(ParseDataSpec("/data/x.npy").status()), HasSubstr("no scheme"));
}

TEST(DataSpec, RejectsEmptyPaths) {
  for (const char* spec : {"npy:", "torch:", "safetensors:", "safetensors::a"}) {
    absl::StatusOr<DataSpec> s = ParseDataSpec(spec);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(Message(s.status()), HasSubstr("empty path")) << spec;
  }
  EXPECT_THAT(Message(ParseDataSpec("safetensors:/x:a,,b").status()), HasSubstr("empty key"));
}

TEST(DataSpec, RejectsBadShapes) {
  for (const char* spec : {"synthetic:", "synthetic:3x0", "synthetic:3xx4", "synthetic:-3", "synthetic:3x+4",
                           "synthetic:3.5", "synthetic:abc", "synthetic:100000x100000"}) {
    EXPECT_EQ(ParseDataSpec(spec).status().code(), absl::StatusCode::kInvalidArgument) << spec;
  }
  EXPECT_THAT(Message(ParseDataSpec("synthetic:3x0").status()), HasSubstr("positive integers joined by 'x'"));
}

TEST(DataSpec, RejectsBadSeeds) {
  for (const char* spec : {"synthetic:3,seed=", "synthetic:3,seed=-1", "synthetic:3,seed=x",
                           "synthetic:3,seed=18446744073709551616", "synthetic:3,seed=1,seed=2",
                           "synthetic:3,sed=1"}) {
    EXPECT_EQ(ParseDataSpec(spec).status().code(), absl::StatusCode::kInvalidArgument) << spec;
  }
  EXPECT_THAT(Message(ParseDataSpec("synthetic:3,seed=x").status()), HasSubstr("seed 'x'"));
}

}  // namespace
}  // namespace recal::data
