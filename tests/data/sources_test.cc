// The concrete sources, through OpenBatchSource as the server calls them.
#include <ATen/ATen.h>

#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/data/batch_source.h"
#include "tests/test_util.h"

namespace recal::data {
namespace {

using ::recal::testing::BytesOf;
using ::recal::testing::NpyFile;
using ::recal::testing::TempDir;
using ::recal::testing::ViewOf;
using ::recal::testing::WriteBytes;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

template <typename T>
std::vector<T> Iota(size_t n) {
  std::vector<T> v(n);
  std::iota(v.begin(), v.end(), T(0));
  return v;
}

// Every batch of `source`, or a test failure.
std::vector<Batch> ReadAll(BatchSource& source) {
  std::vector<Batch> batches;
  for (int guard = 0; guard < 1000; ++guard) {
    absl::StatusOr<std::optional<Batch>> next = source.Next();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) break;
    batches.push_back(**std::move(next));
  }
  return batches;
}

std::unique_ptr<BatchSource> OpenOk(const std::string& spec, int64_t batch_size) {
  absl::StatusOr<std::unique_ptr<BatchSource>> s = OpenBatchSource(spec, batch_size);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// The next batch; an empty batch (and a test failure) if there is none.
Batch NextBatch(BatchSource& source) {
  absl::StatusOr<std::optional<Batch>> next = source.Next();
  EXPECT_TRUE(next.ok() && next->has_value()) << next.status();
  return next.ok() && next->has_value() ? **std::move(next) : Batch{};
}

// The first batch of `spec`; an empty batch (and a test failure) if there is none.
Batch FirstBatch(const std::string& spec, int64_t batch_size) {
  std::unique_ptr<BatchSource> source = OpenOk(spec, batch_size);
  return source == nullptr ? Batch{} : NextBatch(*source);
}

TEST(NpySource, SlicesAlongDim0WithPartialLastBatch) {
  TempDir dir;
  WriteBytes(dir.File("x.npy"), NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (10, 3), }",
                                        BytesOf(Iota<float>(30))));
  auto source = OpenOk(absl::StrCat("npy:", dir.File("x.npy")), 4);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->num_samples(), 10);
  EXPECT_EQ(source->Describe(), absl::StrCat("npy:", dir.File("x.npy"), " (10 x 3 float32)"));
  std::vector<Batch> batches = ReadAll(*source);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_THAT(batches[0][0].sizes(), ElementsAre(4, 3));
  EXPECT_THAT(batches[2][0].sizes(), ElementsAre(2, 3));
  at::Tensor all = at::cat({batches[0][0], batches[1][0], batches[2][0]});
  EXPECT_TRUE(at::equal(all, at::arange(30, at::kFloat).reshape({10, 3})));
  for (const Batch& b : batches) {
    ASSERT_EQ(b.size(), 1u);
    EXPECT_TRUE(b[0].is_contiguous());
    EXPECT_EQ(b[0].scalar_type(), at::kFloat);
  }
  // Exhausted stays exhausted.
  absl::StatusOr<std::optional<Batch>> after = source->Next();
  ASSERT_TRUE(after.ok());
  EXPECT_FALSE(after->has_value());
}

TEST(NpySource, BatchesOwnTheirMemory) {
  TempDir dir;
  WriteBytes(dir.File("x.npy"), NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }",
                                        BytesOf(Iota<float>(4))));
  Batch batch;
  {
    auto source = OpenOk(absl::StrCat("npy:", dir.File("x.npy")), 8);
    ASSERT_NE(source, nullptr);
    batch = NextBatch(*source);
  }  // the mapping is gone; the batch must not point into it
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_TRUE(at::equal(batch[0], at::arange(4, at::kFloat)));
}

TEST(NpySource, Float16BecomesFloat32) {
  TempDir dir;
  const std::vector<uint16_t> halves = {0x3c00, 0x4000, 0x4200};  // 1, 2, 3
  WriteBytes(dir.File("h.npy"), NpyFile("{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", BytesOf(halves)));
  auto source = OpenOk(absl::StrCat("npy:", dir.File("h.npy")), 2);
  ASSERT_NE(source, nullptr);
  std::vector<Batch> batches = ReadAll(*source);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_TRUE(at::equal(batches[0][0], at::tensor({1.0f, 2.0f})));
  EXPECT_TRUE(at::equal(batches[1][0], at::tensor({3.0f})));
}

TEST(NpySource, RejectsZeroDimArray) {
  TempDir dir;
  WriteBytes(dir.File("s.npy"), NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", BytesOf(Iota<float>(1))));
  absl::StatusOr<std::unique_ptr<BatchSource>> s = OpenBatchSource(absl::StrCat("npy:", dir.File("s.npy")), 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s.status()), HasSubstr("0-d tensor"));
}

TEST(NpySource, ErrorsNameTheFile) {
  TempDir dir;
  WriteBytes(dir.File("t.npy"), NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (10,), }", "abc"));
  absl::StatusOr<std::unique_ptr<BatchSource>> s = OpenBatchSource(absl::StrCat("npy:", dir.File("t.npy")), 2);
  EXPECT_THAT(Message(s.status()), HasSubstr(absl::StrCat("npy:", dir.File("t.npy"), ": truncated .npy file")));
}

class SafetensorsSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::vector<formats::SafetensorsEntry> entries = {
        {"x", "F32", {5, 2}, ViewOf(x_)},
        {"y", "I64", {5}, ViewOf(y_)},
        {"z", "F16", {4}, ViewOf(z_)},
        {"w", "BF16", {5}, ViewOf(w_)},
    };
    ASSERT_TRUE(formats::WriteSafetensors(path(), entries).ok());
  }
  std::string path() const { return dir_.File("d.safetensors"); }

  TempDir dir_;
  std::vector<float> x_ = Iota<float>(10);
  std::vector<int64_t> y_ = Iota<int64_t>(5);
  std::vector<uint16_t> z_ = {0x3c00, 0x3c00, 0x3c00, 0x3c00};
  std::vector<uint16_t> w_ = {0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0};  // bf16 1..5
};

TEST_F(SafetensorsSourceTest, MultipleKeysArePositionalInputs) {
  auto source = OpenOk(absl::StrCat("safetensors:", path(), ":y,x"), 2);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->num_samples(), 5);
  EXPECT_EQ(source->Describe(), absl::StrCat("safetensors:", path(), ":y,x (5 x scalar int64, 2 float32)"));
  std::vector<Batch> batches = ReadAll(*source);
  ASSERT_EQ(batches.size(), 3u);
  ASSERT_EQ(batches[2].size(), 2u);
  EXPECT_TRUE(at::equal(batches[2][0], at::tensor({int64_t{4}})));
  EXPECT_TRUE(at::equal(batches[2][1], at::tensor({8.0f, 9.0f}).reshape({1, 2})));
  EXPECT_TRUE(at::equal(batches[1][1], at::arange(4, 8, at::kFloat).reshape({2, 2})));
}

TEST_F(SafetensorsSourceTest, KeepsBFloat16) {  // only uint8 and float16 become float32
  auto source = OpenOk(absl::StrCat("safetensors:", path(), ":w"), 8);
  ASSERT_NE(source, nullptr);
  Batch b = NextBatch(*source);
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b[0].scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(b[0].to(at::kFloat), at::arange(1, 6, at::kFloat)));
}

TEST_F(SafetensorsSourceTest, MismatchedDim0IsAnError) {
  absl::StatusOr<std::unique_ptr<BatchSource>> s = OpenBatchSource(absl::StrCat("safetensors:", path(), ":x,z"), 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s.status()), HasSubstr("must share dim 0"));
  EXPECT_THAT(Message(s.status()), HasSubstr("'x' has 5, 'z' has 4"));
  // No keys = all four tensors, and z disagrees.
  EXPECT_THAT(Message(OpenBatchSource(absl::StrCat("safetensors:", path()), 2).status()), HasSubstr("must share dim 0"));
}

TEST_F(SafetensorsSourceTest, NoKeysMeansAllTensorsSortedByName) {
  const std::vector<float> b = Iota<float>(3);
  const std::vector<double> a64 = {0.5, 1.5, 2.5};
  ASSERT_TRUE(formats::WriteSafetensors(dir_.File("ab.safetensors"),
                                        {{"b", "F32", {3}, ViewOf(b)}, {"a", "F64", {3}, ViewOf(a64)}})
                  .ok());
  auto source = OpenOk(absl::StrCat("safetensors:", dir_.File("ab.safetensors")), 3);
  ASSERT_NE(source, nullptr);
  Batch batch = NextBatch(*source);
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].scalar_type(), at::kDouble);  // "a" first
  EXPECT_EQ(batch[1].scalar_type(), at::kFloat);
}

TEST_F(SafetensorsSourceTest, UnknownKeyIsNotFoundListingTheKeys) {
  absl::StatusOr<std::unique_ptr<BatchSource>> s = OpenBatchSource(absl::StrCat("safetensors:", path(), ":x,nope"), 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s.status()), HasSubstr("no tensor 'nope' in the file; it has: w, x, y, z"));
}

// Files made by the venv's torch, once for the suite (importing torch takes a second).
class TorchSourceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    made_ = recal::testing::RunPython(R"(
import sys, io, torch
d = sys.argv[1]
x = torch.arange(30, dtype=torch.float32).reshape(10, 3)
torch.save(x, d + '/tensor.pt')
torch.save([x, torch.arange(10)], d + '/list.pt')
torch.save((x.half(), torch.arange(10)), d + '/tuple.pt')
torch.save(x.t(), d + '/transposed.pt')
torch.save(x[2:7], d + '/view.pt')
torch.save(torch.nn.Parameter(x), d + '/param.pt')
torch.save(x.clone().requires_grad_(), d + '/grad.pt')
torch.save([x], d + '/one.pt')
torch.save([x, torch.arange(9)], d + '/mismatch.pt')
torch.save({'x': x}, d + '/dict.pt')
torch.save([x, 3], d + '/mixed.pt')
torch.save(torch.tensor(1.0), d + '/scalar.pt')
torch.save(x, d + '/legacy.pt', _use_new_zipfile_serialization=False)
)", dir_->path());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_EQ(made_, 0) << "python3 could not make the torch files"; }

  static std::string Spec(absl::string_view name) { return absl::StrCat("torch:", dir_->File(name)); }

  static TempDir* dir_;
  static int made_;
};
TempDir* TorchSourceTest::dir_ = nullptr;
int TorchSourceTest::made_ = -1;

TEST_F(TorchSourceTest, ReadsTorchSaveZipTensor) {
  auto source = OpenOk(Spec("tensor.pt"), 4);
  ASSERT_NE(source, nullptr);
  EXPECT_EQ(source->num_samples(), 10);
  EXPECT_EQ(source->Describe(), Spec("tensor.pt") + " (10 x 3 float32)");
  std::vector<Batch> batches = ReadAll(*source);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_TRUE(at::equal(at::cat({batches[0][0], batches[1][0], batches[2][0]}),
                        at::arange(30, at::kFloat).reshape({10, 3})));
}

TEST_F(TorchSourceTest, ListAndTupleArePositionalInputs) {
  for (const char* name : {"list.pt", "tuple.pt"}) {
    auto source = OpenOk(Spec(name), 8);
    ASSERT_NE(source, nullptr);
    std::vector<Batch> batches = ReadAll(*source);
    ASSERT_EQ(batches.size(), 2u) << name;
    ASSERT_EQ(batches[1].size(), 2u) << name;
    EXPECT_THAT(batches[1][0].sizes(), ElementsAre(2, 3));
    EXPECT_TRUE(at::equal(batches[1][1], at::arange(8, 10, at::kLong)));
  }
  // The float16 input is served as float32; the int64 one is left alone.
  Batch half = FirstBatch(Spec("tuple.pt"), 8);
  ASSERT_FALSE(half.empty());
  EXPECT_EQ(half[0].scalar_type(), at::kFloat);
  EXPECT_EQ(half[1].scalar_type(), at::kLong);
}

TEST_F(TorchSourceTest, ViewsTransposedTensorsAndParametersComeOutContiguous) {
  Batch t = FirstBatch(Spec("transposed.pt"), 2);
  ASSERT_FALSE(t.empty());
  EXPECT_TRUE(t[0].is_contiguous());
  EXPECT_TRUE(at::equal(t[0], at::arange(30, at::kFloat).reshape({10, 3}).t().slice(0, 0, 2)));
  Batch v = FirstBatch(Spec("view.pt"), 2);
  ASSERT_FALSE(v.empty());
  EXPECT_TRUE(at::equal(v[0], at::arange(6, 12, at::kFloat).reshape({2, 3})));
}

TEST_F(TorchSourceTest, ParametersAndTensorsThatRequiredGradComeOutPlain) {
  for (const char* name : {"param.pt", "grad.pt"}) {
    Batch b = FirstBatch(Spec(name), 2);
    ASSERT_FALSE(b.empty()) << name;
    EXPECT_FALSE(b[0].requires_grad()) << name;
    EXPECT_TRUE(at::equal(b[0], at::arange(6, at::kFloat).reshape({2, 3}))) << name;
  }
}

TEST_F(TorchSourceTest, AListOfOneTensorIsThatTensor) {
  Batch b = FirstBatch(Spec("one.pt"), 2);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_TRUE(at::equal(b[0], at::arange(6, at::kFloat).reshape({2, 3})));
}

TEST_F(TorchSourceTest, RejectsWhatIsNotTensors) {
  EXPECT_THAT(Message(OpenBatchSource(Spec("mismatch.pt"), 2).status()), HasSubstr("must share dim 0"));
  EXPECT_THAT(Message(OpenBatchSource(Spec("dict.pt"), 2).status()),
              HasSubstr("holds a value of type dict; expected a tensor or a list/tuple of tensors"));
  EXPECT_THAT(Message(OpenBatchSource(Spec("mixed.pt"), 2).status()), HasSubstr("element 1 is of type int"));
  EXPECT_THAT(Message(OpenBatchSource(Spec("scalar.pt"), 2).status()), HasSubstr("0-d tensor"));
  EXPECT_THAT(Message(OpenBatchSource(Spec("legacy.pt"), 2).status()), HasSubstr("not a zip-format torch.save file"));
}

TEST(SyntheticSource, IsDeterministicPerSeedAndEndless) {
  auto a = OpenOk("synthetic:3x4,seed=7", 5);
  auto b = OpenOk("synthetic:3x4,seed=7", 5);
  auto c = OpenOk("synthetic:3x4,seed=8", 5);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->num_samples(), std::nullopt);
  EXPECT_EQ(a->Describe(), "synthetic:3x4,seed=7 (endless x 3x4 float32 N(0,1))");
  at::Tensor previous;
  for (int k = 0; k < 3; ++k) {
    Batch ba = NextBatch(*a), bb = NextBatch(*b), bc = NextBatch(*c);
    ASSERT_EQ(ba.size(), 1u);
    EXPECT_THAT(ba[0].sizes(), ElementsAre(5, 3, 4));
    EXPECT_EQ(ba[0].scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(ba[0], bb[0])) << "batch " << k;
    EXPECT_FALSE(at::equal(ba[0], bc[0])) << "batch " << k;
    if (previous.defined()) {
      EXPECT_FALSE(at::equal(ba[0], previous));
    }
    previous = ba[0];
  }
}

TEST(SyntheticSource, LooksStandardNormal) {
  Batch b = FirstBatch("synthetic:1000", 10);
  ASSERT_FALSE(b.empty());
  EXPECT_NEAR(b[0].mean().item<double>(), 0.0, 0.05);
  EXPECT_NEAR(b[0].std().item<double>(), 1.0, 0.05);
}

TEST(OpenBatchSource, RejectsBadSpecsAndBatchSizes) {
  EXPECT_THAT(Message(OpenBatchSource("csv:/x", 2).status()), HasSubstr("unknown scheme 'csv'"));
  EXPECT_EQ(OpenBatchSource("synthetic:3", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(OpenBatchSource("synthetic:3", -1).status()), HasSubstr("batch size must be >= 1, got -1"));
}

TEST(OpenBatchSource, MissingFileIsNotFoundNamingThePath) {
  TempDir dir;
  for (const char* scheme : {"npy:", "safetensors:", "torch:"}) {
    absl::StatusOr<std::unique_ptr<BatchSource>> s = OpenBatchSource(absl::StrCat(scheme, dir.File("missing")), 2);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << scheme;
    EXPECT_THAT(Message(s.status()), HasSubstr(dir.File("missing"))) << scheme;
  }
}

}  // namespace
}  // namespace recal::data
