#include "server/data/image_source.h"

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/data_source.h"
#include "tests/test_util.h"

namespace recal::data {
namespace {

using ::testing::HasSubstr;

constexpr const char* kMean = "0.485,0.456,0.406";
constexpr const char* kStd = "0.229,0.224,0.225";
const double kStdV[3] = {0.229, 0.224, 0.225};

// Good files in sorted relative-path order; bad ones: a/bad_truncated.jpg, c/x.jpg, p/bad_short.png,
// p/bad_truncated.png. p/ holds PNG kinds where PIL differs from libpng's defaults.
const std::vector<std::string> kGood = {
    "a/b/big.JPG",  "a/cmyk.jpg",   "a/gray.jpeg",  "a/tall.jpg",  "c/gray.png",       "c/palette.png", "c/rgba.png",
    "p/gama05.png", "p/gama10.png", "p/gray16.png", "p/gray2.png", "p/interlaced.png", "p/la.png",
    "p/palette_trns.png", "p/rgb16.png", "top.jpeg"};

constexpr const char* kMake = R"PY(
import os, sys, io, struct, zlib, warnings
import numpy as np
from PIL import Image
import torchvision.transforms as T
d = sys.argv[1]
root = os.path.join(d, "imgs"); ref = os.path.join(d, "ref")
for p in ["a/b", "c", "p"]: os.makedirs(os.path.join(root, p), exist_ok=True)
os.makedirs(ref, exist_ok=True)
rng = np.random.default_rng(0)
def smooth(h, w, c):
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 3) % 256,
                     128 + 0 * x], -1)
    a = base[..., :c].astype(np.int32) + rng.integers(-30, 30, (h, w, c))
    return np.clip(a, 0, 255).astype(np.uint8)
Image.fromarray(smooth(375, 500, 3)).save(os.path.join(root, "a/b/big.JPG"), quality=90)
Image.fromarray(smooth(200, 120, 3)).save(os.path.join(root, "a/tall.jpg"), quality=90)
Image.fromarray(smooth(90, 130, 3)).save(os.path.join(root, "top.jpeg"), quality=75)
Image.fromarray(smooth(150, 170, 1)[..., 0], "L").save(os.path.join(root, "a/gray.jpeg"), quality=90)
Image.fromarray(smooth(140, 160, 4), "CMYK").save(os.path.join(root, "a/cmyk.jpg"), quality=90)
Image.fromarray(smooth(100, 90, 4), "RGBA").save(os.path.join(root, "c/rgba.png"))
Image.fromarray(smooth(80, 100, 3)).convert("P", palette=Image.ADAPTIVE, colors=64).save(os.path.join(root, "c/palette.png"))
Image.fromarray(smooth(70, 75, 1)[..., 0], "L").save(os.path.join(root, "c/gray.png"))
b = io.BytesIO(); Image.fromarray(smooth(120, 160, 3)).save(b, "JPEG", quality=90)
open(os.path.join(root, "a/bad_truncated.jpg"), "wb").write(b.getvalue()[: len(b.getvalue()) // 2])
open(os.path.join(root, "c/x.jpg"), "w").write("not an image\n")
open(os.path.join(root, "c/notes.txt"), "w").write("ignored\n")
# PIL can't write gAMA, 16-bit RGB, 2-bit gray or Adam7 PNGs: build those chunk by chunk.
chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
def png(path, a, bits, ctype, pre=b"", interlace=False):
    a = a.reshape(a.shape[0], a.shape[1], -1)
    def rows(sub):  # filter type 0 (none) on every row
        if bits < 8:
            packed = lambda r: np.packbits(np.unpackbits(r.astype(np.uint8)[:, None], axis=1)[:, 8 - bits:])
        else:
            packed = lambda r: r.astype(">u2" if bits == 16 else np.uint8)
        return b"".join(b"\0" + packed(r.reshape(-1)).tobytes() for r in sub)
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    raw = b"".join(rows(a[y::dy, x::dx]) for x, y, dx, dy in (passes if interlace else [(0, 0, 1, 1)])
                   if a[y::dy, x::dx].size)
    ihdr = struct.pack(">IIBBBBB", a.shape[1], a.shape[0], bits, ctype, 0, 0, int(interlace))
    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + pre + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))
    open(os.path.join(root, path), "wb").write(data)
    return data
# PIL ignores gAMA; libpng's simplified API would convert to sRGB.
png("p/gama10.png", smooth(60, 70, 3), 8, 2, pre=chunk(b"gAMA", struct.pack(">I", 100000)))
png("p/gama05.png", smooth(50, 80, 3), 8, 2, pre=chunk(b"gAMA", struct.pack(">I", 50000)))
# Low bytes random, so taking the high byte and rounding to 8 bits differ.
png("p/rgb16.png", smooth(55, 65, 3).astype(np.uint16) * 256 + rng.integers(0, 256, (55, 65, 3)), 16, 2)
# 0..511: PIL opens 16-bit gray as mode "I" and convert("RGB") clips, so about half are 255.
png("p/gray16.png", smooth(45, 85, 1).astype(np.uint16) * 2 + rng.integers(0, 2, (45, 85, 1)), 16, 0)
png("p/gray2.png", smooth(70, 45, 1) // 64, 2, 0)
b = png("p/interlaced.png", smooth(67, 45, 3), 8, 2, interlace=True)
open(os.path.join(root, "p/bad_truncated.png"), "wb").write(b[: len(b) // 2])
open(os.path.join(root, "p/bad_short.png"), "wb").write(b[:20])
Image.fromarray(smooth(80, 60, 2), "LA").save(os.path.join(root, "p/la.png"))
Image.fromarray(smooth(60, 90, 3)).convert("P", palette=Image.ADAPTIVE, colors=32).save(
    os.path.join(root, "p/palette_trns.png"), transparency=bytes(range(0, 256, 8)))
warnings.filterwarnings("ignore", "Palette images with Transparency")  # p/palette_trns.png
tf = T.Compose([T.Resize(64), T.CenterCrop(56), T.ToTensor(),
                T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
for dirpath, _, names in os.walk(root):
    for n in names:
        if n.endswith(".txt") or n == "x.jpg" or n.startswith("bad_"): continue
        rel = os.path.relpath(os.path.join(dirpath, n), root)
        with open(os.path.join(root, rel), "rb") as f:
            img = Image.open(f).convert("RGB")
        np.save(os.path.join(ref, rel.replace("/", "_") + ".npy"), tf(img).numpy())
)PY";

class ImageSourceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    made_ = testing::RunPython(kMake, dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override { ASSERT_EQ(made_, 0) << "fixture script failed"; }

  static std::string Spec(const std::string& extra) {
    return absl::StrCat("images:", dir_->File("imgs"), "?resize=64&crop=56&mean=", kMean, "&std=", kStd, extra);
  }
  static at::Tensor Ref(const std::string& rel) {
    std::string name = rel;
    std::replace(name.begin(), name.end(), '/', '_');
    std::string bytes = testing::ReadBytes(dir_->File("ref/" + name + ".npy"));
    // float32 [3,56,56], 128-byte npy v1 header from numpy.
    const size_t header = 10 + (static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8));
    return at::from_blob(bytes.data() + header, {3, 56, 56}, at::kFloat).clone();
  }
  // All batches of a source, concatenated; fails the test on an error.
  static at::Tensor ReadAll(BatchSource& s) {
    std::vector<at::Tensor> parts;
    while (true) {
      absl::StatusOr<std::optional<Batch>> b = s.Next();
      EXPECT_TRUE(b.ok()) << b.status();
      if (!b.ok() || !b->has_value()) break;
      EXPECT_EQ((**b)[0].size(1), 3);
      parts.push_back((**b)[0]);
    }
    return at::cat(parts);
  }
  // Max |difference| in [0,1] pixel units (normalisation undone).
  static double MaxPixelDiff(const at::Tensor& got, const at::Tensor& want) {
    double worst = 0;
    for (int c = 0; c < 3; ++c) {
      worst = std::max(worst, (got[c] - want[c]).abs().max().item<double>() * kStdV[c]);
    }
    return worst;
  }

  static testing::TempDir* dir_;
  static int made_;
};
testing::TempDir* ImageSourceTest::dir_ = nullptr;
int ImageSourceTest::made_ = -1;

TEST_F(ImageSourceTest, MatchesTorchvisionInSortedOrderSkippingBadFiles) {
  for (bool dct : {false, true}) {
    auto s = OpenImageSource(*ParseDataSpec(Spec("&on_bad=skip")), 3, {.threads = 4, .jpeg_dct_scaling = dct});
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->num_samples(), 20);
    at::Tensor all = ReadAll(**s);
    ASSERT_EQ(all.size(0), static_cast<int64_t>(kGood.size()));
    EXPECT_EQ((*s)->skipped_files(), 4);
    double worst = 0;
    for (size_t i = 0; i < kGood.size(); ++i) {
      const double d = MaxPixelDiff(all[i], Ref(kGood[i]));
      std::cout << (dct ? "dct " : "full ") << kGood[i] << " max diff " << d * 255 << "/255\n";
      worst = std::max(worst, d);
      // Bit for bit: the same libjpeg-turbo decode, Pillow's resampling, float32 arithmetic.
      if (!dct) {
        EXPECT_TRUE(at::equal(all[i], Ref(kGood[i]))) << kGood[i] << " max diff " << d * 255 << "/255";
      }
    }
    std::cout << "max |diff| vs torchvision, DCT scaling " << (dct ? "on" : "off") << ": " << worst * 255 << "/255\n";
  }
}

TEST_F(ImageSourceTest, FailNamesTheBadFile) {
  auto s = OpenBatchSource(Spec(""), 16);
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<std::optional<Batch>> b = (*s)->Next();
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("a/bad_truncated.jpg"));
  // Sorted order: only a/b/big.JPG precedes it.
  auto one = OpenBatchSource(Spec("&samples=1"), 16);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->num_samples(), 1);
  b = (*one)->Next();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(b->has_value());
  EXPECT_TRUE(at::equal((**b)[0][0], Ref("a/b/big.JPG")));
  b = (*one)->Next();
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->has_value());
}

TEST_F(ImageSourceTest, CutPngsAreBadFilesNamedInOrder) {
  // The source itself (no prefetcher, whose errors stick) moves on past a bad file.
  const DataSpec spec =
      *ParseDataSpec(absl::StrCat("images:", dir_->File("imgs/p"), "?resize=64&crop=56&mean=", kMean, "&std=", kStd));
  auto s = OpenImageSource(spec, 16, {.threads = 2});
  ASSERT_TRUE(s.ok()) << s.status();
  for (const char* bad : {"bad_short.png", "bad_truncated.png"}) {
    absl::StatusOr<std::optional<Batch>> b = (*s)->Next();
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
    EXPECT_THAT(std::string(b.status().message()), HasSubstr(bad));
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("bad PNG"));
  }
  absl::StatusOr<std::optional<Batch>> b = (*s)->Next();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(b->has_value());
  EXPECT_EQ((**b)[0].size(0), 8);
}

TEST_F(ImageSourceTest, ShuffleIsSeededAndThreadCountDoesNotMatter) {
  const DataSpec spec = *ParseDataSpec(Spec("&on_bad=skip&shuffle=1&seed=7&samples=6"));
  auto a = OpenImageSource(spec, 4, {.threads = 1});
  auto b = OpenImageSource(spec, 4, {.threads = 4});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->num_samples(), 6);
  at::Tensor ta = ReadAll(**a), tb = ReadAll(**b);
  EXPECT_TRUE(at::equal(ta, tb));
  DataSpec other = spec;
  other.seed = 8;
  auto c = OpenImageSource(other, 4, {.threads = 2});
  ASSERT_TRUE(c.ok());
  at::Tensor tc = ReadAll(**c);
  EXPECT_FALSE(ta.sizes() == tc.sizes() && at::equal(ta, tc));
  // Unshuffled with 1 vs 4 threads.
  auto d1 = OpenImageSource(*ParseDataSpec(Spec("&on_bad=skip")), 5, {.threads = 1});
  auto d4 = OpenImageSource(*ParseDataSpec(Spec("&on_bad=skip")), 5, {.threads = 4});
  EXPECT_TRUE(at::equal(ReadAll(**d1), ReadAll(**d4)));
}

TEST_F(ImageSourceTest, FollowsDirectoryLinksOnceAndKeepsToTheAllowedRoots) {
  namespace fs = std::filesystem;
  testing::TempDir tmp;
  const fs::path root = fs::path(tmp.path()) / "root", other = fs::path(tmp.path()) / "other";
  fs::create_directories(root / "a");
  fs::create_directories(other);
  fs::copy_file(dir_->File("imgs/top.jpeg"), root / "a" / "x.jpeg");
  fs::copy_file(dir_->File("imgs/a/tall.jpg"), other / "y.jpg");
  fs::create_directory_symlink(other, root / "link");  // followed, as os.walk(followlinks=True)
  fs::create_directory_symlink(root, root / "a" / "loop");  // entered once, no endless walk
  const DataSpec spec = *ParseDataSpec(absl::StrCat("images:", root.string(), "?resize=64&crop=56&mean=", kMean,
                                                    "&std=", kStd, "&on_bad=skip"));
  auto open = OpenImageSource(spec, 4, {.threads = 2});
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_EQ((*open)->num_samples(), 2);
  at::Tensor all = ReadAll(**open);
  ASSERT_EQ(all.size(0), 2);
  EXPECT_TRUE(at::equal(all[0], Ref("top.jpeg")));
  EXPECT_TRUE(at::equal(all[1], Ref("a/tall.jpg")));
  // The server's data roots: the link leads outside them, which even on_bad=skip refuses,
  // before the directory is listed (a sandboxed worker could not list it anyway).
  auto confined = OpenImageSource(spec, 4, {.threads = 2, .allowed_roots = {root.string()}});
  EXPECT_EQ(confined.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(confined.status().message()), HasSubstr("link: path"));
  EXPECT_THAT(std::string(confined.status().message()), HasSubstr("outside the server's data roots"));
  // A link to a file outside them is refused when it is read.
  fs::remove(root / "link");
  fs::create_symlink(other / "y.jpg", root / "y.jpg");
  auto file_link = OpenImageSource(spec, 4, {.threads = 2, .allowed_roots = {root.string()}});
  ASSERT_TRUE(file_link.ok()) << file_link.status();
  absl::StatusOr<std::optional<Batch>> b = (*file_link)->Next();
  EXPECT_EQ(b.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("y.jpg"));
  fs::remove(root / "y.jpg");
  fs::create_directory_symlink(other, root / "link");
  auto both = OpenImageSource(spec, 4, {.threads = 2, .allowed_roots = {root.string(), other.string()}});
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(ReadAll(**both).size(0), 2);
}

TEST_F(ImageSourceTest, MissingOrEmptyDirectory) {
  auto s = OpenBatchSource("images:" + dir_->File("nope") + "?resize=8&crop=8&mean=0,0,0&std=1,1,1", 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  s = OpenBatchSource("images:" + dir_->File("ref") + "?resize=8&crop=8&mean=0,0,0&std=1,1,1", 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
}

TEST(ImageSpec, ParsesAndRejects) {
  absl::StatusOr<DataSpec> s =
      ParseDataSpec("images:/d/x?resize=256&crop=224&mean=0.5,0.5,0.5&std=0.25,0.5,1&samples=10&shuffle=1&seed=3&on_bad=skip");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->scheme, DataSpec::Scheme::kImages);
  EXPECT_EQ(s->path, "/d/x");
  EXPECT_EQ(s->resize, 256);
  EXPECT_EQ(s->crop, 224);
  EXPECT_EQ(s->samples, 10);
  EXPECT_TRUE(s->shuffle);
  EXPECT_TRUE(s->skip_bad);
  EXPECT_EQ(s->seed, 3u);
  EXPECT_EQ(s->std[0], 0.25);
  EXPECT_EQ(DataSpecToString(*ParseDataSpec(DataSpecToString(*s))), DataSpecToString(*s));
  for (const char* bad : {
           "images:/d?resize=0&crop=1&mean=0,0,0&std=1,1,1",        // bad resize
           "images:/d?resize=x&crop=1&mean=0,0,0&std=1,1,1",        // bad resize
           "images:/d?resize=8&crop=4&mean=0,0,0&std=1,1,1&foo=1",  // unknown key
           "images:/d?resize=8&crop=9&mean=0,0,0&std=1,1,1",        // crop > resize
           "images:/d?resize=8&crop=4&mean=0,0&std=1,1,1",          // 2 means
           "images:/d?resize=8&crop=4&mean=0,0,0&std=1,0,1",        // zero std
           "images:/d?resize=8&crop=4&mean=0,0,0&std=1,1,1&on_bad=x",
           "images:/d?resize=8&resize=8&crop=4&mean=0,0,0&std=1,1,1",
           "images:?resize=8&crop=4&mean=0,0,0&std=1,1,1",
           "images:",
       }) {
    EXPECT_EQ(ParseDataSpec(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ImageSpec, WhatIsLeftOutIsImageNetsEvaluationTransformAndTheSpecSaysSo) {
  struct Case {
    const char* spec;
    int64_t resize, crop;
  };
  for (const Case& c : {Case{"images:/d", 256, 224}, Case{"images:/d?", 256, 224}, Case{"images:/d?samples=3", 256, 224},
                        Case{"images:/d?crop=299", 342, 299}, Case{"images:/d?resize=320", 320, 280},
                        Case{"images:/d?resize=8&crop=8", 8, 8},
                        // A crop near the largest side: the resize derived from it stays within it.
                        Case{"images:/d?crop=58427", 65536, 58427}, Case{"images:/d?crop=65536", 65536, 65536}}) {
    absl::StatusOr<DataSpec> s = ParseDataSpec(c.spec);
    ASSERT_TRUE(s.ok()) << c.spec << ": " << s.status();
    EXPECT_EQ(s->path, "/d") << c.spec;
    EXPECT_EQ(s->resize, c.resize) << c.spec;
    EXPECT_EQ(s->crop, c.crop) << c.spec;
    EXPECT_EQ(s->mean, (std::vector<double>{0.485, 0.456, 0.406})) << c.spec;
    EXPECT_EQ(s->std, (std::vector<double>{0.229, 0.224, 0.225})) << c.spec;
  }
  // The canonical spelling (what the report's `data` shows) spells the transform out.
  EXPECT_EQ(DataSpecToString(*ParseDataSpec("images:/d")),
            "images:/d?resize=256&crop=224&mean=0.485,0.456,0.406&std=0.229,0.224,0.225");
  // An explicit mean keeps ImageNet's std, and the other way round.
  EXPECT_EQ(ParseDataSpec("images:/d?mean=0,0,0")->std, (std::vector<double>{0.229, 0.224, 0.225}));
  // A message from the API that leaves them unset gets the same (what the server checks and runs).
  v1::ImageFolderSource folder;
  folder.set_path("/d");
  folder.set_crop(299);
  const v1::ImageFolderSource filled = WithImageNetDefaults(folder);
  EXPECT_EQ(filled.resize(), 342);
  EXPECT_EQ(filled.crop(), 299);
  EXPECT_EQ(filled.mean_size(), 3);
  EXPECT_FLOAT_EQ(filled.std(2), 0.225f);
}

}  // namespace
}  // namespace recal::data
