// The command lines of recal-server, recal-run and recal-worker as a person meets them:
// --help lists every flag a user can set (those declared beside the object-storage client
// too) and exits 0, the server listens on loopback by default, --version names the version and the LibTorch, and a mistyped flag is
// refused naming the nearest one.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/nearest_name.h"
#include "tests/test_util.h"

namespace recal {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunBinary;

TEST(NearestNameTest, TyposAndNamesCutShortFindTheFlagAndStrangersFindNothing) {
  const std::vector<std::string> names = {"listen", "data_root", "max_batch_bytes", "max_batch_size", "log_level"};
  EXPECT_EQ(NearestName("listn", names), "listen");
  EXPECT_EQ(NearestName("data_roots", names), "data_root");
  EXPECT_EQ(NearestName("max_batch_byte", names), "max_batch_bytes");
  EXPECT_EQ(NearestName("loglevel", names), "log_level");
  EXPECT_EQ(NearestName("max_batch", names), "max_batch_bytes");  // cut short: a prefix
  EXPECT_EQ(NearestName("frobnicate", names), "");
  EXPECT_EQ(NearestName("x", names), "");
  EXPECT_EQ(DidYouMean("listn", names, "--"), "; did you mean --listen?");
  EXPECT_EQ(DidYouMean("zzzzzz", names, "--"), "");
}

TEST(CommandLineTest, HelpListsEveryFlagAndExitsZero) {
  const testing::Result server = RunBinary(RECAL_SERVER_BIN, {"--help"});
  EXPECT_EQ(server.exit_code, 0) << server.err;
  for (const char* flag : {"--listen=", "--data_root=", "--max_batch_bytes=", "--metrics_listen=", "--s3_endpoint="}) {
    EXPECT_THAT(server.out, HasSubstr(flag));
  }
  EXPECT_THAT(server.out, Not(HasSubstr("--flagfile")));  // Abseil's own are not the binary's options
  const testing::Result run = RunBinary(RECAL_RUN_BIN, {"--help"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  for (const char* flag : {"--model=", "--allow_short_data=", "--s3_endpoint=", "--compute_dtype="}) {
    EXPECT_THAT(run.out, HasSubstr(flag));
  }
}

TEST(CommandLineTest, ServerListensOnLoopbackUnlessToldOtherwise) {
  // Both listeners: metrics on every interface by default would publish job and tenant
  // counts to anyone who can reach the host (deployments pass 0.0.0.0:9464 explicitly).
  const testing::Result server = RunBinary(RECAL_SERVER_BIN, {"--help"});
  EXPECT_EQ(server.exit_code, 0) << server.err;
  EXPECT_THAT(server.out, HasSubstr("--listen=\"127.0.0.1:50051\""));
  EXPECT_THAT(server.out, HasSubstr("--metrics_listen=\"127.0.0.1:9464\""));
  EXPECT_THAT(server.out, HasSubstr("[--listen=127.0.0.1:50051]"));  // the usage line agrees
  EXPECT_THAT(server.out, Not(HasSubstr("0.0.0.0:9464\"")));
}

TEST(CommandLineTest, VersionNamesTheBuildAndItsLibTorch) {
  const testing::Result server = RunBinary(RECAL_SERVER_BIN, {"--version"});
  EXPECT_EQ(server.exit_code, 0) << server.err;
  EXPECT_THAT(server.out, ::testing::MatchesRegex("recal-server [^ ]+ \\(LibTorch [0-9][^ ]*\\)\n"));
  // The programs that run models say which statistics kernels the GPU path has.
  for (const char* binary : {RECAL_RUN_BIN, RECAL_WORKER_BIN}) {
    const testing::Result version = RunBinary(binary, {"--version"});
    EXPECT_EQ(version.exit_code, 0) << binary << ": " << version.err;
    EXPECT_THAT(version.out, ::testing::MatchesRegex("recal-[a-z]+ [^ ]+ \\(LibTorch [0-9][^ ]*\\)\n"
                                                     "GPU statistics: (Recal's CUDA kernel|ATen's kernels) .*\n"))
        << binary;
  }
}

TEST(CommandLineTest, AMistypedFlagIsRefusedNamingTheNearest) {
  const testing::Result server = RunBinary(RECAL_SERVER_BIN, {"--listn=127.0.0.1:0"});
  EXPECT_EQ(server.exit_code, 2);
  EXPECT_THAT(server.err, HasSubstr("unknown flag --listn; did you mean --listen?"));
  const testing::Result run = RunBinary(RECAL_RUN_BIN, {"--model", "m.pt", "--batch_sise", "8"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("unknown flag --batch_sise; did you mean --batch_size?"));
  // A value that looks like a flag ("--priority -5") is a value, and --noBOOL is a bool set false.
  const testing::Result negated = RunBinary(RECAL_RUN_BIN, {"--noallow_short_data", "--threads", "-1", "--version"});
  EXPECT_EQ(negated.exit_code, 0) << negated.err;
}

}  // namespace
}  // namespace recal
