#include "common/atomic_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace recal {
namespace {

using ::recal::testing::ReadBytes;
using ::recal::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(WriteFileAtomically, CreatesFileWithContents) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.File("a.bin"), std::string("hello\0world", 11)).ok());
  EXPECT_EQ(ReadBytes(dir.File("a.bin")), std::string("hello\0world", 11));
  EXPECT_THAT(dir.List(), ElementsAre("a.bin"));
}

TEST(WriteFileAtomically, OverwritesExistingFile) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.File("a"), "a long first version").ok());
  ASSERT_TRUE(WriteFileAtomically(dir.File("a"), "short").ok());
  EXPECT_EQ(ReadBytes(dir.File("a")), "short");
  EXPECT_THAT(dir.List(), ElementsAre("a"));
}

TEST(WriteFileAtomically, MissingDirectoryIsNotFoundNamingTheFile) {
  TempDir dir;
  absl::Status s = WriteFileAtomically(dir.File("no/such/dir/x"), "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir.File("no/such/dir/x")));
}

TEST(AtomicFileWriter, StreamsAppendsAndCommits) {
  TempDir dir;
  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Open(dir.File("out"));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(w->temp_path(), StartsWith(dir.File("out.tmp.")));
  ASSERT_TRUE(w->Append("abc").ok());
  ASSERT_TRUE(w->Append("").ok());
  ASSERT_TRUE(w->Append("def").ok());
  // Nothing is visible under the final name before Commit.
  struct stat st;
  EXPECT_NE(::stat(dir.File("out").c_str(), &st), 0);
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_EQ(ReadBytes(dir.File("out")), "abcdef");
  EXPECT_THAT(dir.List(), ElementsAre("out"));
}

TEST(AtomicFileWriter, AbandonedWriterLeavesNoTempFileAndKeepsTarget) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.File("out"), "old").ok());
  {
    absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Open(dir.File("out"));
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->Append("new").ok());
    EXPECT_EQ(dir.List().size(), 2u);
  }
  EXPECT_EQ(ReadBytes(dir.File("out")), "old");
  EXPECT_THAT(dir.List(), ElementsAre("out"));
}

TEST(AtomicFileWriter, AppendAfterCommitIsFailedPrecondition) {
  TempDir dir;
  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Open(dir.File("out"));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->Commit().ok());
  EXPECT_EQ(w->Append("x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadBytes(dir.File("out")), "");
}

TEST(AtomicFileWriter, MovedWriterOwnsTheTempFile) {
  TempDir dir;
  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Open(dir.File("out"));
  ASSERT_TRUE(w.ok());
  AtomicFileWriter moved = *std::move(w);
  ASSERT_TRUE(moved.Append("x").ok());
  ASSERT_TRUE(moved.Commit().ok());
  EXPECT_EQ(ReadBytes(dir.File("out")), "x");
  EXPECT_THAT(dir.List(), ElementsAre("out"));
}

TEST(AtomicFileWriter, FailedRenameOntoDirectoryRemovesTempFile) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.File("target").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(dir.File("target/inner").c_str(), 0755), 0);  // non-empty: rename fails
  absl::StatusOr<AtomicFileWriter> w = AtomicFileWriter::Open(dir.File("target"));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(w->Append("x").ok());
  absl::Status s = w->Commit();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot rename"));
  EXPECT_THAT(dir.List(), ElementsAre("target"));
}

TEST(AtomicFileWriter, RejectsEmptyPathAndTrailingSlash) {
  EXPECT_EQ(AtomicFileWriter::Open("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AtomicFileWriter::Open("/tmp/").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(AtomicFileWriter, RelativePathInCurrentDirectoryWorks) {
  TempDir dir;
  char old_cwd[4096];
  ASSERT_NE(::getcwd(old_cwd, sizeof(old_cwd)), nullptr);
  ASSERT_EQ(::chdir(dir.path().c_str()), 0);
  absl::Status s = WriteFileAtomically("rel.txt", "r");
  ASSERT_EQ(::chdir(old_cwd), 0);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(ReadBytes(dir.File("rel.txt")), "r");
}

}  // namespace
}  // namespace recal
