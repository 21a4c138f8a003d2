#include "server/data/normalization.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace recal::data {
namespace {

using ::recal::testing::BytesOf;
using ::recal::testing::NpyFile;
using ::recal::testing::TempDir;
using ::recal::testing::WriteBytes;
using ::testing::HasSubstr;

// What torchvision's ToTensor + Normalize compute, in float32, independently of the code.
at::Tensor Expected(const std::vector<uint8_t>& pixels, std::vector<int64_t> shape) {
  at::Tensor x = at::tensor(std::vector<float>(pixels.begin(), pixels.end())).reshape(shape) / 255.0f;
  const at::Tensor mean = at::tensor({0.485f, 0.456f}).view({1, 2, 1});
  const at::Tensor std = at::tensor({0.229f, 0.224f}).view({1, 2, 1});
  return (x - mean) / std;
}

TEST(Normalization, Uint8NpyIsScaledAndNormalisedPerChannel) {
  TempDir dir;
  std::vector<uint8_t> pixels(3 * 2 * 4);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 11);
  WriteBytes(dir.File("u8.npy"), NpyFile("{'descr': '|u1', 'fortran_order': False, 'shape': (3, 2, 4), }",
                                         BytesOf(pixels)));
  auto source = OpenBatchSource(
      absl::StrCat("npy:", dir.File("u8.npy"), "?scale=255&mean=0.485,0.456&std=0.229,0.224"), 2);
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<at::Tensor> got;
  while (true) {
    auto batch = (*source)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (!batch->has_value()) break;
    ASSERT_EQ((**batch)[0].scalar_type(), at::kFloat);
    got.push_back((**batch)[0]);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(at::allclose(at::cat(got), Expected(pixels, {3, 2, 4}), 0, 1e-6));
}

TEST(Normalization, ChannelCountMismatchNamesTheSource) {
  TempDir dir;
  WriteBytes(dir.File("u8.npy"), NpyFile("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3, 1), }",
                                         BytesOf(std::vector<uint8_t>(6, 7))));
  auto source = OpenBatchSource(absl::StrCat("npy:", dir.File("u8.npy"), "?mean=0,0&std=1,1"), 2);
  ASSERT_TRUE(source.ok()) << source.status();
  auto batch = (*source)->Next();
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(batch.status().message()), HasSubstr("2/2 values for an input with 3 channels"));
  EXPECT_THAT(std::string(batch.status().message()), HasSubstr("u8.npy"));
}

TEST(Normalization, LeavesIntegerIdsAndFloat64Alone) {
  const Normalization scale_only{255, {}, {}};
  const at::Tensor ids = at::arange(6, at::kLong);
  auto out = ToModelInput(ids, scale_only);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(*out, ids));
  const at::Tensor f64 = at::ones({2, 3}, at::kDouble);
  out = ToModelInput(f64, scale_only);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->scalar_type(), at::kDouble);
}

TEST(Normalization, Float16BecomesFloat32AndInputIsNotModified) {
  const at::Tensor half = at::full({2, 1}, 51.0, at::kHalf);
  auto out = ToModelInput(half, {51, {1.0}, {0.5}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(*out, at::zeros({2, 1})));  // (51 / 51 - 1) / 0.5
  EXPECT_EQ(half[0][0].item<float>(), 51.0f);
  const at::Tensor f32 = at::full({2, 1}, 3.0);
  out = ToModelInput(f32, {3, {}, {}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)[0][0].item<float>(), 1.0f);
  EXPECT_EQ(f32[0][0].item<float>(), 3.0f);
}

}  // namespace
}  // namespace recal::data
