// What only the file-system blob store does (server/store/local_blob_store.h): its layout on
// disk, readers that outlive a removal, uploads that survive a reopen and a process that dies.
// The contract both stores keep is in blob_store_conformance_test.cc.
#include "server/store/local_blob_store.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "common/sha256.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace recal::store {
namespace {

using ::recal::testing::ReadBytes;
using ::recal::testing::TempDir;
using ::recal::testing::WriteBytes;

std::unique_ptr<LocalBlobStore> OpenStore(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<LocalBlobStore>> store = LocalBlobStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

TEST(LocalBlobStoreTest, BlobsLiveUnderTheirDigest) {
  TempDir dir;
  auto store = OpenStore(dir.File("blobs"));
  const std::string hex = *store->Put("hello");
  EXPECT_EQ(store->PathOf(hex), dir.File("blobs/blobs/sha256/" + hex.substr(0, 2) + "/" + hex));
  EXPECT_EQ(ReadBytes(store->PathOf(hex)), "hello");
  EXPECT_EQ(*store->LocalPath(hex), store->PathOf(hex));
  EXPECT_EQ(store->scratch_dir(), dir.File("blobs/tmp"));
  EXPECT_EQ(store->Describe(), "file:" + dir.File("blobs"));
}

TEST(LocalBlobStoreTest, AReaderOutlivesRemoval) {
  TempDir tmp;
  auto store = OpenStore(tmp.path());
  const std::string hex = *store->Put("0123456789");
  auto reader = store->OpenReader(hex);
  ASSERT_TRUE(reader.ok()) << reader.status();
  // A download in progress keeps its bytes when the blob goes.
  ASSERT_TRUE(store->Remove(hex).ok());
  std::string bytes;
  ASSERT_TRUE((*reader)->ReadAt(0, 10, &bytes).ok());
  EXPECT_EQ(bytes, "0123456789");
  EXPECT_TRUE(absl::IsNotFound(store->OpenReader(hex).status()));
}

TEST(LocalBlobStoreTest, UploadResumesAfterReopen) {
  TempDir dir;
  const std::string data = "0123456789";
  const std::string hex = Sha256Hex(data);
  {
    auto store = OpenStore(dir.path());
    ASSERT_TRUE(store->AppendUpload("t", hex, 0, data.substr(0, 6), 10).ok());
  }
  auto store = OpenStore(dir.path());
  EXPECT_EQ(*store->UploadedSize("t", hex), 6);
  ASSERT_TRUE(store->AppendUpload("t", hex, 6, data.substr(6), 10).ok());
  EXPECT_EQ(ReadBytes(*store->CommitUpload("t", hex, 10)), data);
}

TEST(LocalBlobStoreTest, UploadSurvivesAProcessThatDiesWithoutCleanup) {
  TempDir dir;
  const std::string data = "durable bytes";
  const std::string hex = Sha256Hex(data);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto store = LocalBlobStore::Open(dir.path());
    const bool ok = store.ok() && (*store)->AppendUpload("t", hex, 0, data.substr(0, 7), 13).ok();
    ::_exit(ok ? 0 : 1);  // no destructors, no flushes
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto store = OpenStore(dir.path());
  EXPECT_EQ(*store->UploadedSize("t", hex), 7);
}

TEST(LocalBlobStoreTest, OpenRefusesAFileWhereADirectoryShouldBe) {
  TempDir dir;
  WriteBytes(dir.File("uploads"), "not a dir");
  absl::StatusOr<std::unique_ptr<LocalBlobStore>> store = LocalBlobStore::Open(dir.path());
  EXPECT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("uploads"), absl::string_view::npos) << store.status();
}

}  // namespace
}  // namespace recal::store
