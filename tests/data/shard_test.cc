// How a sharded job splits its data: ShardBatchRange and OpenBatchSourceShard. That the
// merged statistics equal the unsharded run's is tests/e2e/check_sharded_run.py.
#include <ATen/ATen.h>

#include <numeric>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/data/batch_source.h"
#include "tests/test_util.h"

namespace recal::data {
namespace {

using ::recal::testing::BytesOf;
using ::recal::testing::NpyFile;
using ::recal::testing::TempDir;
using ::recal::testing::WriteBytes;
using ::testing::HasSubstr;

std::vector<at::Tensor> FirstInputs(BatchSource& source) {
  std::vector<at::Tensor> out;
  while (true) {
    auto next = source.Next();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) return out;
    out.push_back((**next)[0]);
  }
}

TEST(ShardBatchRange, ShardsCoverTheBatchesInOrderWithSizesDifferingByOne) {
  for (int shards = 1; shards <= 7; ++shards) {
    int64_t next = 0;
    for (int k = 0; k < shards; ++k) {
      auto range = ShardBatchRange(/*num_samples=*/53, /*batch_size=*/5, {k, shards});  // 11 batches
      ASSERT_TRUE(range.ok()) << range.status();
      EXPECT_EQ(range->first, next);
      EXPECT_GE(range->count, 11 / shards);
      EXPECT_LE(range->count, 11 / shards + 1);
      next += range->count;
    }
    EXPECT_EQ(next, 11);
  }
}

TEST(ShardBatchRange, UsesWhatTheUnshardedRunWould) {
  // max_batches caps the batches; unset, the default cap; an endless source gives the cap.
  EXPECT_EQ(ShardBatchRange(1000, 10, {1, 2, /*max_batches=*/6})->first, 3);
  EXPECT_EQ(ShardBatchRange(10000, 10, {1, 2, 0, /*default_batches=*/200})->first, 100);
  EXPECT_EQ(ShardBatchRange(std::nullopt, 10, {3, 4, 0, 200})->count, 50);
  EXPECT_EQ(ShardBatchRange(std::nullopt, 10, {0, 3, 7})->count, 2);
  // A huge max_batches (the job spec's) splits without overflowing.
  const int64_t huge = int64_t{1} << 62;
  auto last = ShardBatchRange(std::nullopt, 10, {63, 64, huge});
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->first, huge / 64 * 63);
  EXPECT_EQ(last->first + last->count, huge);
}

TEST(ShardBatchRange, RefusesWhatCannotBeSplit) {
  EXPECT_THAT(std::string(ShardBatchRange(20, 8, {0, 4}).status().message()), HasSubstr("fewer than its 4 shards"));
  EXPECT_THAT(std::string(ShardBatchRange(20, 8, {0, 2, 5}).status().message()),
              HasSubstr("fewer than max_batches=5"));
  EXPECT_TRUE(ShardBatchRange(20, 8, {0, 2, 5, 200, /*allow_short_data=*/true}).ok());
  EXPECT_FALSE(ShardBatchRange(20, 8, {2, 2}).ok());
  EXPECT_FALSE(ShardBatchRange(20, 8, {0, 0}).ok());
  EXPECT_FALSE(ShardBatchRange(0, 8, {0, 1}).ok());
}

TEST(OpenBatchSourceShard, ShardsOfAFileAreItsBatchesInOrder) {
  TempDir dir;
  std::vector<float> values(23 * 2);
  std::iota(values.begin(), values.end(), 0.0f);
  WriteBytes(dir.File("x.npy"), NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (23, 2), }",
                                        BytesOf(values)));
  const std::string spec = absl::StrCat("npy:", dir.File("x.npy"));
  auto whole = OpenBatchSource(spec, 4);
  ASSERT_TRUE(whole.ok());
  const std::vector<at::Tensor> expected = FirstInputs(**whole);  // 6 batches, the last of 3
  for (int shards = 1; shards <= 6; ++shards) {
    std::vector<at::Tensor> got;
    for (int k = 0; k < shards; ++k) {
      auto shard = OpenBatchSourceShard(spec, 4, {}, {k, shards});
      ASSERT_TRUE(shard.ok()) << shard.status();
      std::vector<at::Tensor> part = FirstInputs(*shard->source);
      EXPECT_EQ(static_cast<int64_t>(part.size()), shard->range.count);
      got.insert(got.end(), part.begin(), part.end());
    }
    ASSERT_EQ(got.size(), expected.size()) << shards << " shards";
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], expected[i])) << shards << " shards, batch " << i;
  }
}

TEST(OpenBatchSourceShard, ShardsOfASyntheticSourceAreItsBatchesByIndex) {
  auto whole = OpenBatchSource("synthetic:3x2,seed=7", 5);
  ASSERT_TRUE(whole.ok());
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 6; ++i) expected.push_back((**(*whole)->Next())[0]);
  auto shard = OpenBatchSourceShard("synthetic:3x2,seed=7", 5, {.prefetch_depth = 1}, {2, 3, /*max_batches=*/6});
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->range.first, 4);
  const std::vector<at::Tensor> got = FirstInputs(*shard->source);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(at::equal(got[0], expected[4]));
  EXPECT_TRUE(at::equal(got[1], expected[5]));
}

}  // namespace
}  // namespace recal::data
