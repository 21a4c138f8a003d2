// The disk floor's rule, with an injected reading of the free space; and the real reading.
#include "server/store/disk_floor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace recal::store {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

FreeBytesFn Free(int64_t bytes) {
  return [bytes]() -> absl::StatusOr<int64_t> { return bytes; };
}

TEST(DiskFloorTest, BytesAreAdmittedWhileTheyLeaveTheFloorFree) {
  const DiskFloor floor("/data", 1000, Free(5000));
  EXPECT_TRUE(floor.Admit(0).ok());
  EXPECT_TRUE(floor.Admit(4000).ok());  // exactly the floor left
  const absl::Status refused = floor.Admit(4001);
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(), AllOf(HasSubstr("5000 bytes free"), HasSubstr("4001 more"),
                                       HasSubstr("1000 it keeps free (--min_free_disk_bytes)"),
                                       HasSubstr("upload again")));
  EXPECT_THAT(refused.message(), ::testing::Not(HasSubstr("/data"))) << "a client is not told the server's paths";
  EXPECT_FALSE(floor.Below());
  EXPECT_TRUE(DiskFloor("/data", 1000, Free(999)).Below());
}

TEST(DiskFloorTest, WithoutAFloorNothingIsRefusedNorReadAndAnUnreadableDiskIsAnError) {
  bool read = false;
  const DiskFloor none("/data", 0, [&read]() -> absl::StatusOr<int64_t> {
    read = true;
    return 0;
  });
  EXPECT_TRUE(none.Admit(int64_t{1} << 40).ok());
  EXPECT_FALSE(none.Below());
  EXPECT_FALSE(read);
  const DiskFloor unreadable("/data", 1, [] { return absl::StatusOr<int64_t>(absl::InternalError("statvfs failed")); });
  EXPECT_EQ(unreadable.Admit(1).code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(unreadable.Below());
}

TEST(DiskFloorTest, TheRealReadingIsTheFileSystemsAndNamesAPathItCannotRead) {
  testing::TempDir dir;
  const DiskFloor floor(dir.path(), 1);
  absl::StatusOr<int64_t> free = floor.FreeBytes();
  ASSERT_TRUE(free.ok()) << free.status();
  EXPECT_GT(*free, 0);
  const absl::StatusOr<int64_t> missing = FreeBytesAt(dir.File("missing"));
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("missing"));
}

}  // namespace
}  // namespace recal::store
