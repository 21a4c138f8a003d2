// Which files an image folder uses, and in which order (server/data_access/image_files.h):
// the rules a local folder and a prefix in a bucket share. The batches they give are
// checked against torchvision in image_source_test.cc and s3_sources_test.cc.
#include "server/data_access/image_files.h"

#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recal::data {
namespace {

using ::testing::ElementsAre;

DataSpec Images(bool shuffle, uint64_t seed, int64_t samples) {
  DataSpec spec;
  spec.scheme = DataSpec::Scheme::kImages;
  spec.shuffle = shuffle;
  spec.seed = seed;
  spec.samples = samples;
  return spec;
}

TEST(ImageFiles, ImageNamesByExtensionAnyCase) {
  for (const char* name : {"a.jpg", "b/c.JPEG", "d.Png", "e.f.jpeg", "x/.hidden.png"}) {
    EXPECT_TRUE(IsImageFileName(name)) << name;
  }
  for (const char* name : {".png", "a/.jpg", "a.gif", "a.jpg.txt", "a", "a.jpg/", "png"}) {
    EXPECT_FALSE(IsImageFileName(name)) << name;
  }
}

TEST(ImageFiles, SortedByteWiseThenTheFirstSamples) {
  const std::vector<std::string> listed = {"b/z.png", "B.jpg", "a.jpg", "a/b.jpg", "a-b.jpg"};
  EXPECT_THAT(SelectImageFiles(listed, Images(false, 0, -1)),
              ElementsAre("B.jpg", "a-b.jpg", "a.jpg", "a/b.jpg", "b/z.png"));
  EXPECT_THAT(SelectImageFiles(listed, Images(false, 0, 2)), ElementsAre("B.jpg", "a-b.jpg"));
  EXPECT_EQ(SelectImageFiles(listed, Images(false, 0, 9)).size(), listed.size());
}

TEST(ImageFiles, ShuffleDependsOnTheSeedAndTheFilesNotTheirListingOrder) {
  std::vector<std::string> listed;
  for (int i = 0; i < 20; ++i) listed.push_back(std::to_string(100 + i) + ".png");
  std::vector<std::string> reversed(listed.rbegin(), listed.rend());
  const std::vector<std::string> shuffled = SelectImageFiles(listed, Images(true, 7, -1));
  EXPECT_EQ(SelectImageFiles(reversed, Images(true, 7, -1)), shuffled);
  EXPECT_NE(shuffled, SelectImageFiles(listed, Images(false, 7, -1)));
  EXPECT_NE(shuffled, SelectImageFiles(listed, Images(true, 8, -1)));
  EXPECT_EQ(std::set<std::string>(shuffled.begin(), shuffled.end()),
            std::set<std::string>(listed.begin(), listed.end()));
  // samples takes the first of the shuffled order.
  EXPECT_EQ(SelectImageFiles(listed, Images(true, 7, 5)),
            std::vector<std::string>(shuffled.begin(), shuffled.begin() + 5));
}

}  // namespace
}  // namespace recal::data
