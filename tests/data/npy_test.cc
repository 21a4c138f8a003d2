#include "common/formats/npy.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace recal::formats {
namespace {

using ::recal::testing::NpyFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(NpyHeader, ParsesVersion1) {
  const std::string file = NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", std::string(48, '\0'));
  absl::StatusOr<NpyHeader> h = ParseNpyFile(file);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->major_version, 1);
  EXPECT_EQ(h->descr, "<f4");
  EXPECT_EQ(h->dtype, DType::kF32);
  EXPECT_FALSE(h->fortran_order);
  EXPECT_THAT(h->shape, ElementsAre(3, 4));
  EXPECT_EQ(h->data_offset, static_cast<int64_t>(file.size()) - 48);
  EXPECT_EQ(h->data_offset % 64, 0);
  EXPECT_EQ(h->data_size, 48);
}

TEST(NpyHeader, ParsesVersion2And3WithFourByteLength) {
  for (int version : {2, 3}) {
    const std::string file = NpyFile("{'descr': '<f2', 'fortran_order': False, 'shape': (5,), }", std::string(10, '\0'), version);
    absl::StatusOr<NpyHeader> h = ParseNpyFile(file);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->major_version, version);
    EXPECT_EQ(h->dtype, DType::kF16);
    EXPECT_THAT(h->shape, ElementsAre(5));
    EXPECT_EQ(h->data_offset, static_cast<int64_t>(file.size()) - 10);
  }
}

TEST(NpyHeader, AcceptsKeyOrderDoubleQuotesAndNoTrailingComma) {
  absl::StatusOr<NpyHeader> h = ParseNpyHeader(NpyFile("{\"shape\": (2,3),\"fortran_order\":False,'descr':'|u1'}", ""));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->dtype, DType::kU8);
  EXPECT_THAT(h->shape, ElementsAre(2, 3));
}

TEST(NpyHeader, ParsesScalarShapeAndPython2Longs) {
  absl::StatusOr<NpyHeader> h = ParseNpyHeader(NpyFile("{'descr': '<i8', 'fortran_order': False, 'shape': (), }", ""));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->shape.empty());
  EXPECT_EQ(h->data_size, 8);
  h = ParseNpyHeader(NpyFile("{'descr': '<i8', 'fortran_order': False, 'shape': (2L, 3L), }", ""));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_THAT(h->shape, ElementsAre(2, 3));
}

TEST(NpyHeader, MapsEveryCommonDescr) {
  const std::pair<const char*, DType> cases[] = {
      {"<f8", DType::kF64}, {"<f4", DType::kF32}, {"<f2", DType::kF16}, {"<i8", DType::kI64},
      {"<i4", DType::kI32}, {"<i2", DType::kI16}, {"|i1", DType::kI8},  {"|u1", DType::kU8},
      {"|b1", DType::kBool}};
  for (const auto& [descr, dtype] : cases) {
    absl::StatusOr<NpyHeader> h = ParseNpyHeader(
        NpyFile(absl::StrCat("{'descr': '", descr, "', 'fortran_order': False, 'shape': (1,), }"), ""));
    ASSERT_TRUE(h.ok()) << descr << ": " << h.status();
    EXPECT_EQ(h->dtype, dtype) << descr;
  }
}

TEST(NpyHeader, RejectsFortranOrder) {
  absl::StatusOr<NpyHeader> h = ParseNpyHeader(NpyFile("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }", ""));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(h.status()), HasSubstr("Fortran"));
  EXPECT_THAT(Message(h.status()), HasSubstr("np.ascontiguousarray"));
}

TEST(NpyHeader, RejectsBigEndian) {
  absl::StatusOr<NpyHeader> h = ParseNpyHeader(NpyFile("{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }", ""));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(h.status()), HasSubstr("big-endian"));
}

TEST(NpyHeader, RejectsObjectStructuredAndUnsupportedDtypes) {
  EXPECT_THAT(Message(ParseNpyHeader(NpyFile("{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", "")).status()),
              HasSubstr("unsupported .npy dtype '|O'"));
  EXPECT_THAT(Message(ParseNpyHeader(NpyFile("{'descr': '|O8', 'fortran_order': False, 'shape': (3,), }", "")).status()),
              HasSubstr("object"));
  EXPECT_THAT(Message(ParseNpyHeader(NpyFile("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }", "")).status()),
              HasSubstr("structured"));
  EXPECT_THAT(Message(ParseNpyHeader(NpyFile("{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", "")).status()),
              HasSubstr("'<c8'"));
  EXPECT_THAT(Message(ParseNpyHeader(NpyFile("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", "")).status()),
              HasSubstr("'<u2'"));
}

TEST(NpyHeader, RejectsMalformedDicts) {
  const char* bad[] = {
      "",
      "['descr', '<f4']",
      "{'descr': '<f4', 'fortran_order': False}",                          // no shape
      "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), 'x': 1}",  // extra key
      "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}",
      "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (3,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': [3]}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (3 4)}",
      "{'descr': '<f4 , 'fortran_order': False, 'shape': (3,)}",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)} trailing",
      "{'descr': '<f4', 'fortran_order': False, 'shape': (3,)",
  };
  for (const char* dict : bad) {
    absl::StatusOr<NpyHeader> h = ParseNpyHeader(NpyFile(dict, ""));
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << dict;
  }
}

TEST(NpyHeader, RejectsBadMagicAndVersion) {
  EXPECT_THAT(Message(ParseNpyHeader("PK\x03\x04 not npy").status()), HasSubstr("not a .npy file"));
  std::string file = NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", "");
  file[6] = 4;
  EXPECT_THAT(Message(ParseNpyHeader(file).status()), HasSubstr("unsupported .npy format version 4.0"));
}

TEST(NpyHeader, RejectsTruncatedHeader) {
  const std::string file = NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", "");
  EXPECT_THAT(Message(ParseNpyHeader(file.substr(0, 9)).status()), HasSubstr("truncated"));
  EXPECT_THAT(Message(ParseNpyHeader(file.substr(0, 40)).status()), HasSubstr("truncated .npy header"));
}

TEST(NpyFile, RejectsTruncatedData) {
  const std::string file = NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", std::string(47, '\0'));
  absl::StatusOr<NpyHeader> h = ParseNpyFile(file);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(h.status()), HasSubstr("needs 48 data bytes"));
  EXPECT_THAT(Message(h.status()), HasSubstr("only 47"));
}

TEST(NpyFile, RejectsOverflowingShape) {
  absl::StatusOr<NpyHeader> h = ParseNpyHeader(
      NpyFile("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", ""));
  EXPECT_THAT(Message(h.status()), HasSubstr("too large"));
}

TEST(NpyFile, ParsesFilesWrittenByNumpy) {
  recal::testing::TempDir dir;
  ASSERT_EQ(recal::testing::RunPython(R"(
import sys, numpy as np
d = sys.argv[1]
np.save(d + '/a.npy', np.arange(12, dtype='<f2').reshape(3, 4))
np.lib.format.write_array(open(d + '/b.npy', 'wb'), np.zeros((2, 5), dtype='<i8'), version=(2, 0))
np.save(d + '/c.npy', np.asfortranarray(np.zeros((2, 3), dtype='<f4')))
np.save(d + '/d.npy', np.zeros((3,), dtype='>f4'))
)", dir.path()), 0);
  absl::StatusOr<NpyHeader> a = ParseNpyFile(recal::testing::ReadBytes(dir.File("a.npy")));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->dtype, DType::kF16);
  EXPECT_THAT(a->shape, ElementsAre(3, 4));
  absl::StatusOr<NpyHeader> b = ParseNpyFile(recal::testing::ReadBytes(dir.File("b.npy")));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->major_version, 2);
  EXPECT_EQ(b->dtype, DType::kI64);
  EXPECT_THAT(Message(ParseNpyFile(recal::testing::ReadBytes(dir.File("c.npy"))).status()), HasSubstr("Fortran"));
  EXPECT_THAT(Message(ParseNpyFile(recal::testing::ReadBytes(dir.File("d.npy"))).status()), HasSubstr("big-endian"));
}

}  // namespace
}  // namespace recal::formats
