#include "common/mapped_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace recal::data {
namespace {

using ::recal::testing::TempDir;
using ::recal::testing::WriteBytes;
using ::testing::HasSubstr;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(MappedFile, MapsWholeFile) {
  TempDir dir;
  WriteBytes(dir.File("f"), std::string("abc\0def", 7));
  absl::StatusOr<std::unique_ptr<MappedFile>> f = MappedFile::Open(dir.File("f"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->bytes(), absl::string_view("abc\0def", 7));
  EXPECT_EQ((*f)->size(), 7u);
  EXPECT_EQ((*f)->path(), dir.File("f"));
}

TEST(MappedFile, MissingFileIsNotFound) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<MappedFile>> f = MappedFile::Open(dir.File("nope"));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(f.status()), HasSubstr(dir.File("nope")));
}

TEST(MappedFile, DirectoryIsRejected) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<MappedFile>> f = MappedFile::Open(dir.path());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(f.status()), HasSubstr("is a directory"));
}

TEST(MappedFile, EmptyFileIsRejected) {
  TempDir dir;
  WriteBytes(dir.File("e"), "");
  EXPECT_THAT(Message(MappedFile::Open(dir.File("e")).status()), HasSubstr("is empty"));
}

TEST(MappedFile, UnreadableFileIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads everything";
  TempDir dir;
  WriteBytes(dir.File("secret"), "x");
  ASSERT_EQ(::chmod(dir.File("secret").c_str(), 0), 0);
  EXPECT_EQ(MappedFile::Open(dir.File("secret")).status().code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace recal::data
