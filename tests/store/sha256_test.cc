#include "common/sha256.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace recal {
namespace {

constexpr char kEmpty[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr char kAbc[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), kEmpty);
  EXPECT_EQ(Sha256Hex("abc"), kAbc);
  // FIPS 180-2 two-block vector.
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256Test, IncrementalEqualsOneShotAndRestarts) {
  Sha256 h;
  h.Update("a");
  h.Update("");
  h.Update("bc");
  EXPECT_EQ(h.HexDigest(), kAbc);
  // After a digest the object starts over.
  EXPECT_EQ(h.HexDigest(), kEmpty);
}

TEST(Sha256Test, FileIsStreamed) {
  testing::TempDir dir;
  std::string big(3 * (1 << 20) + 17, '\0');  // spans several read buffers
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31 + 7);
  testing::WriteBytes(dir.File("big"), big);
  testing::WriteBytes(dir.File("abc"), "abc");
  EXPECT_EQ(*Sha256OfFile(dir.File("abc")), kAbc);
  EXPECT_EQ(*Sha256OfFile(dir.File("big")), Sha256Hex(big));
}

TEST(Sha256Test, MissingFileIsNotFoundAndNamesThePath) {
  testing::TempDir dir;
  absl::StatusOr<std::string> r = Sha256OfFile(dir.File("nope"));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("nope"), absl::string_view::npos);
}

TEST(Sha256Test, IsSha256Hex) {
  EXPECT_TRUE(IsSha256Hex(kAbc));
  EXPECT_FALSE(IsSha256Hex(""));
  EXPECT_FALSE(IsSha256Hex(std::string(kAbc).substr(1)));
  std::string upper(kAbc);
  upper[0] = 'B';
  EXPECT_FALSE(IsSha256Hex(upper));
  EXPECT_FALSE(IsSha256Hex(std::string(62, 'a') + "/x"));
}

}  // namespace
}  // namespace recal
