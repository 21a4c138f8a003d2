#include "common/formats/safetensors.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace recal::formats {
namespace {

using ::recal::testing::BytesOf;
using ::recal::testing::ReadBytes;
using ::recal::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

std::string SafetensorsFile(absl::string_view json, absl::string_view data) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return absl::StrCat(out, json, data);
}

TEST(SafetensorsParse, ParsesEntriesSortedByNameAndMetadata) {
  const std::string json =
      R"({"b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]},)"
      R"("a":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]},)"
      R"("__metadata__":{"format":"pt"}}   )";
  const std::string file = SafetensorsFile(json, std::string(12, '\0'));
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(file);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->tensors[0].name, "a");
  EXPECT_EQ(h->tensors[0].dtype, DType::kF32);
  EXPECT_THAT(h->tensors[0].shape, ElementsAre(2, 1));
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].begin, 8);
  EXPECT_EQ(h->tensors[1].end, 12);
  EXPECT_EQ(h->data_offset, static_cast<int64_t>(8 + json.size()));
  EXPECT_THAT(h->metadata, ElementsAre(Pair("format", "pt")));
  EXPECT_NE(h->Find("b"), nullptr);
  EXPECT_EQ(h->Find("c"), nullptr);
}

TEST(SafetensorsParse, AcceptsEveryDtypeAndScalars) {
  const std::string file = SafetensorsFile(
      R"({"f64":{"dtype":"F64","shape":[],"data_offsets":[0,8]},)"
      R"("bf16":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]},)"
      R"("i16":{"dtype":"I16","shape":[1],"data_offsets":[10,12]},)"
      R"("i8":{"dtype":"I8","shape":[1],"data_offsets":[12,13]},)"
      R"("u8":{"dtype":"U8","shape":[1],"data_offsets":[13,14]},)"
      R"("b":{"dtype":"BOOL","shape":[1],"data_offsets":[14,15]},)"
      R"("empty":{"dtype":"I64","shape":[0,3],"data_offsets":[15,15]}})",
      std::string(15, '\0'));
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(file);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->Find("bf16")->dtype, DType::kBF16);
  EXPECT_EQ(h->Find("b")->dtype, DType::kBool);
  EXPECT_TRUE(h->Find("f64")->shape.empty());
}

TEST(SafetensorsParse, RejectsOffsetsBeyondFile) {
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(
      SafetensorsFile(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(12, '\0')));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(h.status()), HasSubstr("beyond the 12-byte data section"));
}

TEST(SafetensorsParse, RejectsOverlappingEntries) {
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(SafetensorsFile(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
      std::string(12, '\0')));
  EXPECT_THAT(Message(h.status()), HasSubstr("entries 'a' [0, 8] and 'b' [4, 12] overlap"));
}

TEST(SafetensorsParse, RejectsShapeSizeMismatch) {
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(
      SafetensorsFile(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')));
  EXPECT_THAT(Message(h.status()), HasSubstr("shape [3] of F32 needs 12 bytes, but data_offsets [0, 8] span 8"));
}

TEST(SafetensorsParse, RejectsBadJson) {
  absl::StatusOr<SafetensorsHeader> h =
      ParseSafetensors(SafetensorsFile(R"({"a":{"dtype":"F32",)", ""));
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(h.status()), HasSubstr("not valid JSON"));
  EXPECT_THAT(Message(ParseSafetensors(SafetensorsFile("[1,2]", "")).status()), HasSubstr("must start with '{'"));
}

TEST(SafetensorsParse, RejectsBadEntries) {
  const char* bad[] = {
      R"({"a":3})",
      R"({"a":{"shape":[1],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F8","shape":[1],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4]}})",
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})",
      R"({"a":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})",
      R"({"__metadata__":"x"})",
  };
  for (const char* json : bad) {
    EXPECT_EQ(ParseSafetensors(SafetensorsFile(json, std::string(8, '\0'))).status().code(),
              absl::StatusCode::kInvalidArgument)
        << json;
  }
  EXPECT_THAT(Message(ParseSafetensors(SafetensorsFile(bad[2], std::string(8, '\0'))).status()),
              HasSubstr("unsupported dtype 'F8'"));
}

TEST(SafetensorsParse, RejectsTruncatedAndHugeHeaders) {
  EXPECT_THAT(Message(ParseSafetensors("abc").status()), HasSubstr("fewer than the 8-byte"));
  std::string file = SafetensorsFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x");
  EXPECT_THAT(Message(ParseSafetensors(file.substr(0, 20)).status()), HasSubstr("truncated"));
  file[6] = 1;  // declares a 2^48-byte header
  EXPECT_THAT(Message(ParseSafetensors(file).status()), HasSubstr("exceeds"));
}

TEST(SafetensorsWrite, RoundTripsThroughParse) {
  TempDir dir;
  // Entries point at bytes they do not own: keep them alive.
  const std::string w = BytesOf(std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f});
  const std::string m = BytesOf(std::vector<double>{0.1, 0.2});
  const std::string u = BytesOf(std::vector<uint8_t>{1, 2, 3});
  const std::vector<SafetensorsEntry> entries = {
      {"layer.weight", "F32", {2, 3}, w},
      {"a \"quoted\" name", "U8", {3}, u},
      {"bn.running_mean", "F64", {2}, m},
  };
  ASSERT_TRUE(WriteSafetensors(dir.File("x.safetensors"), entries, {{"format", "pt"}}).ok());
  EXPECT_THAT(dir.List(), ElementsAre("x.safetensors"));

  const std::string file = ReadBytes(dir.File("x.safetensors"));
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(file);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->data_offset % 8, 0);
  EXPECT_THAT(h->metadata, ElementsAre(Pair("format", "pt")));
  ASSERT_EQ(h->tensors.size(), 3u);
  for (const SafetensorsEntry& e : entries) {
    const SafetensorsTensorInfo* t = h->Find(e.name);
    ASSERT_NE(t, nullptr) << e.name;
    EXPECT_EQ(SafetensorsDTypeName(t->dtype), e.dtype);
    EXPECT_EQ(t->shape, e.shape);
    EXPECT_EQ(t->begin % ElementSize(t->dtype), 0) << "misaligned " << e.name;
    EXPECT_EQ(file.substr(h->data_offset + t->begin, t->end - t->begin), e.bytes) << e.name;
  }
  // Keys are written sorted, after the metadata.
  const size_t meta = file.find("__metadata__"), quoted = file.find("a \\\"quoted\\\" name"),
               bn = file.find("bn.running_mean"), layer = file.find("layer.weight");
  EXPECT_LT(meta, quoted);
  EXPECT_LT(quoted, bn);
  EXPECT_LT(bn, layer);
}

TEST(SafetensorsWrite, IsReadableByPythonJsonAndNumpy) {
  TempDir dir;
  const std::vector<float> w = {1.0f, 2.0f, 3.0f};
  ASSERT_TRUE(WriteSafetensors(dir.File("x.safetensors"), {{"w", "F32", {3}, BytesOf(w)}}).ok());
  EXPECT_EQ(recal::testing::RunPython(R"(
import sys, json, struct, numpy as np
b = open(sys.argv[1] + '/x.safetensors', 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
s, e = h['w']['data_offsets']
assert h['w'] == {'dtype': 'F32', 'shape': [3], 'data_offsets': [0, 12]}, h
assert np.frombuffer(b[8 + n + s:8 + n + e], '<f4').tolist() == [1.0, 2.0, 3.0]
)", dir.path()), 0);
}

TEST(SafetensorsWrite, RejectsBadEntriesWithoutTouchingTheTarget) {
  TempDir dir;
  const std::vector<float> w = {1.0f, 2.0f};
  const std::string path = dir.File("x.safetensors");
  EXPECT_THAT(Message(WriteSafetensors(path, {{"w", "F32", {3}, BytesOf(w)}})),
              HasSubstr("tensor 'w' of shape [3] F32 needs 12 bytes, got 8"));
  EXPECT_THAT(Message(WriteSafetensors(path, {{"w", "F31", {2}, BytesOf(w)}})), HasSubstr("unknown dtype 'F31'"));
  EXPECT_THAT(Message(WriteSafetensors(path, {{"w", "F32", {2}, BytesOf(w)}, {"w", "U8", {8}, BytesOf(w)}})),
              HasSubstr("appears twice"));
  EXPECT_THAT(Message(WriteSafetensors(path, {{"", "F32", {2}, BytesOf(w)}})), HasSubstr("invalid tensor name"));
  EXPECT_THAT(Message(WriteSafetensors(path, {{"__metadata__", "F32", {2}, BytesOf(w)}})),
              HasSubstr("invalid tensor name"));
  EXPECT_TRUE(dir.List().empty());
}

TEST(SafetensorsWrite, EmptyFileHasOnlyHeader) {
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.File("e.safetensors"), {}).ok());
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensors(ReadBytes(dir.File("e.safetensors")));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_TRUE(h->tensors.empty());
}

}  // namespace
}  // namespace recal::formats
