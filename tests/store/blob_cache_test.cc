// The bounded cache of local blob copies (server/store/blob_cache.h): the least recently used
// entries go first once the entries pass the bound, never one that is held or was used within
// the grace; files that are not entries are neither counted nor removed.
#include "server/store/blob_cache.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace recal::store {
namespace {

using ::recal::testing::TempDir;
using ::recal::testing::WriteBytes;

// An entry of `bytes` bytes, last used `age` ago.
std::string AddEntry(const TempDir& dir, const std::string& name, int bytes, absl::Duration age) {
  const std::string hex = Sha256Hex(name);
  const std::string path = dir.File(hex);
  WriteBytes(path, std::string(static_cast<size_t>(bytes), 'x'));
  const timespec used = absl::ToTimespec(absl::Now() - age);
  const timespec times[2] = {used, used};
  EXPECT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
  return hex;
}

std::vector<std::string> Entries(const TempDir& dir) { return dir.List(); }

TEST(BlobCacheTest, OverItsBoundTheLeastRecentlyUsedEntriesGoFirst) {
  TempDir dir;
  BlobCache cache(dir.path(), 250);
  const std::string oldest = AddEntry(dir, "a", 100, absl::Hours(3));
  const std::string older = AddEntry(dir, "b", 100, absl::Hours(2));
  const std::string old = AddEntry(dir, "c", 100, absl::Hours(1));
  absl::StatusOr<BlobCache::Trimmed> trimmed = cache.Trim();
  ASSERT_TRUE(trimmed.ok()) << trimmed.status();
  EXPECT_EQ(trimmed->entries, 1);
  EXPECT_EQ(trimmed->bytes, 100);
  EXPECT_EQ(trimmed->kept_bytes, 200);
  EXPECT_FALSE(cache.Find(oldest).has_value());
  EXPECT_EQ(Entries(dir).size(), 2u);
  // Within the bound: nothing more goes.
  EXPECT_EQ(cache.Trim()->entries, 0);
  EXPECT_TRUE(cache.Find(older).has_value());
  EXPECT_TRUE(cache.Find(old).has_value());
}

TEST(BlobCacheTest, FindMarksAnEntryUsedSoItOutlivesOnesUsedSinceItWasMade) {
  TempDir dir;
  BlobCache cache(dir.path(), 150, absl::ZeroDuration());
  const std::string first = AddEntry(dir, "first", 100, absl::Hours(2));
  const std::string second = AddEntry(dir, "second", 100, absl::Hours(1));
  absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(cache.Find(first), dir.File(first));
  ASSERT_EQ(cache.Trim()->entries, 1);
  EXPECT_TRUE(cache.Find(first).has_value());
  EXPECT_FALSE(cache.Find(second).has_value());
}

TEST(BlobCacheTest, AHeldEntryAndOneUsedWithinTheGraceStayOverTheBound) {
  TempDir dir;
  BlobCache cache(dir.path(), 50, absl::Minutes(1));
  const std::string held = AddEntry(dir, "held", 100, absl::Hours(2));
  const std::string recent = AddEntry(dir, "recent", 100, absl::Seconds(5));
  std::shared_ptr<void> hold = cache.Hold(held);
  absl::StatusOr<BlobCache::Trimmed> trimmed = cache.Trim();
  ASSERT_TRUE(trimmed.ok()) << trimmed.status();
  EXPECT_EQ(trimmed->entries, 0);
  EXPECT_EQ(trimmed->kept_bytes, 200);
  // A second hold of the same entry: released once both are gone.
  std::shared_ptr<void> again = cache.Hold(held);
  hold.reset();
  EXPECT_EQ(cache.Trim()->entries, 0);
  again.reset();
  trimmed = cache.Trim();
  EXPECT_EQ(trimmed->entries, 1);
  EXPECT_EQ(trimmed->kept_bytes, 100);
  EXPECT_EQ(Entries(dir), std::vector<std::string>{recent});
}

TEST(BlobCacheTest, AnEntryHeldBeforeItExistsIsKeptOnceItComes) {
  TempDir dir;
  BlobCache cache(dir.path(), 50, absl::ZeroDuration());
  std::shared_ptr<void> hold = cache.Hold(Sha256Hex("coming"));
  const std::string coming = AddEntry(dir, "coming", 100, absl::Hours(1));
  EXPECT_EQ(cache.Trim()->entries, 0);
  EXPECT_TRUE(cache.Find(coming).has_value());
}

TEST(BlobCacheTest, FilesThatAreNoEntriesAreNeitherCountedNorRemoved) {
  TempDir dir;
  BlobCache cache(dir.path(), 50, absl::ZeroDuration());
  const std::string hex = Sha256Hex("fetching");
  const std::string temporary = hex + ".tmp.123.00000000deadbeef";  // a fetch under way
  WriteBytes(dir.File(temporary), std::string(100, 'x'));
  WriteBytes(dir.File("notes"), std::string(100, 'x'));
  ::mkdir(dir.File(Sha256Hex("a directory")).c_str(), 0700);
  absl::StatusOr<BlobCache::Trimmed> trimmed = cache.Trim();
  ASSERT_TRUE(trimmed.ok()) << trimmed.status();
  EXPECT_EQ(trimmed->entries, 0);
  EXPECT_EQ(trimmed->kept_bytes, 0);
  EXPECT_EQ(Entries(dir).size(), 3u);
}

TEST(BlobCacheTest, WithoutABoundNothingIsRemoved) {
  TempDir dir;
  BlobCache cache(dir.path(), 0, absl::ZeroDuration());
  AddEntry(dir, "a", 100, absl::Hours(5));
  AddEntry(dir, "b", 100, absl::Hours(4));
  EXPECT_EQ(cache.Trim()->entries, 0);
  EXPECT_EQ(Entries(dir).size(), 2u);
}

TEST(BlobCacheTest, RemoveDropsAnEntryAndIsFineWithOneThatIsGone) {
  TempDir dir;
  BlobCache cache(dir.path(), 0);
  const std::string hex = AddEntry(dir, "a", 10, absl::ZeroDuration());
  EXPECT_TRUE(cache.Remove(hex).ok());
  EXPECT_TRUE(cache.Remove(hex).ok());
  EXPECT_FALSE(cache.Find(hex).has_value());
}

}  // namespace
}  // namespace recal::store
