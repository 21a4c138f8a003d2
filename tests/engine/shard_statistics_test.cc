// A shard's statistics survive the trip through a file bit for bit, and the reader refuses
// what is not a whole statistics file.
#include "server/engine/shard_statistics.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/formats/safetensors.h"
#include "tests/test_util.h"

namespace recal::engine {
namespace {

using ::recal::testing::TempDir;
using ::recal::testing::WriteBytes;
using ::testing::HasSubstr;

LayerStats Accumulated(int calls, int channels, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  LayerStats stats;
  for (int i = 0; i < calls; ++i) {
    const int64_t n = i % 3 == 2 ? 1 : 10 + i;  // some calls without a variance
    stats.AddCall(n, at::randn({channels}, gen, at::kDouble) * 3 + 100, at::rand({channels}, gen, at::kDouble));
  }
  return stats;
}

ShardStatistics Example() {
  ShardStatistics s;
  s.batches = 7;
  s.samples = 53;
  s.seconds = 1.25;
  s.stopped_early = true;
  s.memory_format = MemoryFormat::kChannelsLast;
  s.layers.push_back({"bn1.running_mean", "bn1.running_var", 7, 2, Accumulated(7, 4, 1)});
  s.layers.push_back({"stat_mean", "stat_var", 14, 0, Accumulated(14, 3, 2)});
  s.layers.push_back({"unused.running_mean", "unused.running_var", 0, 0, LayerStats()});
  return s;
}

void ExpectSameMoments(const Moments& a, const Moments& b) {
  EXPECT_EQ(a.count(), b.count());
  if (a.count() == 0) return;
  EXPECT_TRUE(at::equal(a.mean(), b.mean()));
  EXPECT_TRUE(at::equal(a.m2(), b.m2()));
}

TEST(ShardStatistics, RoundTripsBitForBit) {
  TempDir dir;
  const ShardStatistics written = Example();
  ASSERT_TRUE(WriteShardStatistics(dir.File("s.safetensors"), written).ok());
  auto read = ReadShardStatistics(dir.File("s.safetensors"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->batches, 7);
  EXPECT_EQ(read->samples, 53);
  EXPECT_DOUBLE_EQ(read->seconds, 1.25);
  EXPECT_TRUE(read->stopped_early);
  EXPECT_EQ(read->memory_format, MemoryFormat::kChannelsLast);
  ASSERT_EQ(read->layers.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const LayerTally& a = written.layers[i];
    const LayerTally& b = read->layers[i];
    EXPECT_EQ(a.mean_key, b.mean_key);
    EXPECT_EQ(a.var_key, b.var_key);
    EXPECT_EQ(a.calls, b.calls);
    EXPECT_EQ(a.refined_calls, b.refined_calls);
    EXPECT_EQ(a.stats.calls(), b.stats.calls());
    EXPECT_EQ(a.stats.calls_without_variance(), b.stats.calls_without_variance());
    ExpectSameMoments(a.stats.population(), b.stats.population());
    ExpectSameMoments(a.stats.call_means(), b.stats.call_means());
    ExpectSameMoments(a.stats.call_vars(), b.stats.call_vars());
  }
}

TEST(ShardStatistics, RefusesOtherFiles) {
  TempDir dir;
  // A safetensors file, but not statistics.
  const double values[2] = {1, 2};
  ASSERT_TRUE(formats::WriteSafetensors(dir.File("other.safetensors"),
                                        {{"x", "F64", {2}, absl::string_view(reinterpret_cast<const char*>(values),
                                                                             sizeof(values))}})
                  .ok());
  EXPECT_THAT(std::string(ReadShardStatistics(dir.File("other.safetensors")).status().message()),
              HasSubstr("not a recal-shard-statistics"));
  // Statistics cut short.
  ASSERT_TRUE(WriteShardStatistics(dir.File("s.safetensors"), Example()).ok());
  std::string bytes = ::recal::testing::ReadBytes(dir.File("s.safetensors"));
  WriteBytes(dir.File("cut.safetensors"), bytes.substr(0, bytes.size() - 9));
  EXPECT_TRUE(absl::IsInvalidArgument(ReadShardStatistics(dir.File("cut.safetensors")).status()));
  EXPECT_TRUE(absl::IsNotFound(ReadShardStatistics(dir.File("missing")).status()));
}

}  // namespace
}  // namespace recal::engine
