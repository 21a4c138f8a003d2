#include "server/log/repeat_limiter.h"

#include <string>

#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace recal::log {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(RepeatLimiterTest, WritesTheFirstOfAnIntervalThenSummarizesTheRest) {
  RepeatLimiter limiter(3, absl::Seconds(10));
  int written = 0;
  int first_unwritten = 0;
  for (int i = 0; i < 1000; ++i) {
    const RepeatLimiter::Decision d = limiter.Note("ipv4:10.0.0.1", kT0 + absl::Milliseconds(i));
    written += d.write;
    first_unwritten += d.first_unwritten;
    EXPECT_EQ(d.suppressed_before, 0);
  }
  EXPECT_EQ(written, 3);
  EXPECT_EQ(first_unwritten, 1);
  // The next event after the interval reports the 997 left out and starts a new interval.
  const RepeatLimiter::Decision later = limiter.Note("ipv4:10.0.0.1", kT0 + absl::Seconds(11));
  EXPECT_EQ(later.suppressed_before, 997);
  EXPECT_TRUE(later.write);
  const RepeatLimiter::Decision quiet = limiter.Note("ipv4:10.0.0.1", kT0 + absl::Seconds(30));
  EXPECT_EQ(quiet.suppressed_before, 0);
}

TEST(RepeatLimiterTest, EachPeerHasItsOwnAllowance) {
  RepeatLimiter limiter(1, absl::Seconds(10));
  EXPECT_TRUE(limiter.Note("a", kT0).write);
  EXPECT_FALSE(limiter.Note("a", kT0).write);
  EXPECT_TRUE(limiter.Note("b", kT0).write);
}

TEST(RepeatLimiterTest, ManyPeersShareOneEntryBeyondTheMost) {
  RepeatLimiter limiter(1, absl::Seconds(10), /*max_sources=*/2);
  EXPECT_TRUE(limiter.Note("a", kT0).write);
  EXPECT_TRUE(limiter.Note("b", kT0).write);
  int written = 0;
  for (int i = 0; i < 100; ++i) written += limiter.Note("peer" + std::to_string(i), kT0).write;
  EXPECT_EQ(written, 1);
  // Ended windows that owe no summary make room again.
  EXPECT_TRUE(limiter.Note("c", kT0 + absl::Seconds(20)).write);
}

TEST(WarnLimitedTest, WritesTheAllowanceThenOneNoticeThenTheSummary) {
  RepeatLimiter limiter(2, absl::Milliseconds(300));
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 10; ++i) WarnLimited(limiter, "ipv4:10.0.0.9", "audit", {{"resource", "x"}});
  absl::SleepFor(absl::Milliseconds(310));
  WarnLimited(limiter, "ipv4:10.0.0.9", "audit", {{"resource", "x"}});
  const std::string written = ::testing::internal::GetCapturedStderr();
  int lines = 0;
  for (char c : written) lines += c == '\n';
  EXPECT_EQ(lines, 5) << written;  // 2, the notice, the summary, then the next interval's first
  EXPECT_NE(written.find("audit: further ones from this peer are counted, not logged"), std::string::npos);
  EXPECT_NE(written.find("audit: 8 more suppressed"), std::string::npos) << written;
}

TEST(PeerHostTest, DropsThePortSoNewConnectionsAreTheSamePeer) {
  EXPECT_EQ(PeerHost("ipv4:127.0.0.1:5123"), "ipv4:127.0.0.1");
  EXPECT_EQ(PeerHost("ipv6:[::1]:5123"), "ipv6:[::1]");
  EXPECT_EQ(PeerHost("ipv6:[::1]"), "ipv6:[::1]");
  EXPECT_EQ(PeerHost("unix:/tmp/socket"), "unix:/tmp/socket");
}

}  // namespace
}  // namespace recal::log
