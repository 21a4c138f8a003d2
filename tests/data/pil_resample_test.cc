#include "server/data/pil_resample.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace recal::data {
namespace {

// Random RGB images resized with Pillow itself (downscale by large and small factors,
// upscale, one-pixel sides, one axis unchanged), then cropped as CenterCrop does; written as
// raw bytes with one line per case: h w out_h out_w top left crop_h crop_w.
constexpr const char* kMake = R"PY(
import os, sys
import numpy as np
from PIL import Image
d = sys.argv[1]
rng = np.random.default_rng(1)
cases = [(375, 500, 256, 341, 224), (500, 375, 300, 225, 200), (37, 53, 80, 114, 64), (1, 9, 4, 36, 4),
         (9, 1, 36, 4, 3), (64, 64, 64, 64, 32), (64, 90, 64, 45, 40), (1000, 17, 1000, 5, 5),
         (333, 777, 123, 287, 123), (2, 2, 1, 1, 1)]
with open(os.path.join(d, "cases.txt"), "w") as f:
    for i, (h, w, oh, ow, c) in enumerate(cases):
        a = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if i % 2:  # smooth content as well as noise
            a = np.clip(np.add.outer(np.arange(h), np.arange(w))[..., None] * 3 % 256 + a // 8, 0, 255).astype(np.uint8)
        r = np.asarray(Image.fromarray(a).resize((ow, oh), Image.BILINEAR))
        top, left = int(round((oh - c) / 2.0)), int(round((ow - c) / 2.0))
        r = np.ascontiguousarray(r[top:top + c, left:left + c])
        a.tofile(os.path.join(d, "in%d.bin" % i)); r.tofile(os.path.join(d, "out%d.bin" % i))
        f.write("%d %d %d %d %d %d %d %d\n" % (h, w, oh, ow, top, left, c, c))
)PY";

TEST(PilResample, MatchesPillowBitForBit) {
  testing::TempDir dir;
  ASSERT_EQ(testing::RunPython(kMake, dir.path()), 0);
  std::ifstream cases(dir.File("cases.txt"));
  std::string line;
  int index = 0;
  for (; std::getline(cases, line); ++index) {
    std::istringstream in(line);
    int64_t h, w, oh, ow, top, left, ch, cw;
    in >> h >> w >> oh >> ow >> top >> left >> ch >> cw;
    const std::string pixels = testing::ReadBytes(dir.File(absl::StrCat("in", index, ".bin")));
    const std::string want = testing::ReadBytes(dir.File(absl::StrCat("out", index, ".bin")));
    RgbImage image{w, h, std::vector<uint8_t>(pixels.begin(), pixels.end())};
    const RgbImage got = ResizeCropLikePil(image, oh, ow, top, left, ch, cw);
    ASSERT_EQ(got.width, cw);
    ASSERT_EQ(got.height, ch);
    ASSERT_EQ(got.pixels.size(), want.size()) << line;
    int64_t differing = 0;
    for (size_t i = 0; i < want.size(); ++i) differing += got.pixels[i] != static_cast<uint8_t>(want[i]);
    EXPECT_EQ(differing, 0) << "case " << line;
  }
  EXPECT_EQ(index, 10);
}

}  // namespace
}  // namespace recal::data
