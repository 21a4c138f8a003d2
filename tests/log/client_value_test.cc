#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/log/log.h"

namespace recal::log {
namespace {

using ::testing::EndsWith;
using ::testing::StartsWith;

TEST(ClientValueTest, ShortValuesAreWrittenWhole) {
  EXPECT_EQ(ClientValue(""), "");
  EXPECT_EQ(ClientValue("job-0123456789abcdef"), "job-0123456789abcdef");
  const std::string at_limit(kMaxClientValueBytes, 'x');
  EXPECT_EQ(ClientValue(at_limit), at_limit);
}

TEST(ClientValueTest, LongValuesAreClippedAndSaySo) {
  const std::string id(7 << 20, 'a');
  const std::string clipped = ClientValue(id);
  EXPECT_THAT(clipped, StartsWith(std::string(kMaxClientValueBytes, 'a')));
  EXPECT_THAT(clipped, EndsWith("\u2026(7340032 bytes, truncated)"));
  EXPECT_LT(clipped.size(), kMaxClientValueBytes + 40);
  EXPECT_THAT(ClientValue(std::string(kMaxClientValueBytes + 1, 'b')), EndsWith("(257 bytes, truncated)"));
}

TEST(ClientValueTest, AClipNeverSplitsAUtf8Character) {
  // "é" is two bytes: the one the limit falls within is left out whole, never cut in two.
  std::string value(kMaxClientValueBytes - 1, 'x');
  for (int i = 0; i < 10; ++i) value += "\xc3\xa9";
  const std::string clipped = ClientValue(value);
  EXPECT_THAT(clipped, StartsWith(std::string(kMaxClientValueBytes - 1, 'x') + "\xe2\x80\xa6"));
}

TEST(ClientValueTest, AClippedValueStaysOneLogLine) {
  const std::string line = FormatLine(Format::kText, Level::kWarning, "t", "audit",
                                      {{"resource", ClientValue(std::string(1 << 20, '\n'))}});
  EXPECT_LT(line.size(), 2 * kMaxClientValueBytes + 100);
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace recal::log
