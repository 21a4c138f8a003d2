#include "server/store/blob_store.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "common/sha256.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace recal::store {
namespace {

using ::recal::testing::ReadBytes;
using ::recal::testing::TempDir;
using ::recal::testing::WriteBytes;

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::unique_ptr<BlobStore> OpenStore(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<BlobStore>> store = BlobStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(*store) : nullptr;
}

TEST(BlobStoreTest, PutHasSizeRemove) {
  TempDir dir;
  auto store = OpenStore(dir.File("blobs"));
  const std::string hex = *store->Put("hello");
  EXPECT_EQ(hex, Sha256Hex("hello"));
  EXPECT_TRUE(store->Has(hex));
  EXPECT_EQ(*store->SizeOf(hex), 5);
  EXPECT_EQ(store->PathOf(hex), dir.File("blobs/blobs/sha256/" + hex.substr(0, 2) + "/" + hex));
  EXPECT_EQ(ReadBytes(store->PathOf(hex)), "hello");
  EXPECT_EQ(*store->Put("hello"), hex);  // same bytes, same blob

  ASSERT_TRUE(store->Remove(hex).ok());
  EXPECT_FALSE(store->Has(hex));
  EXPECT_TRUE(absl::IsNotFound(store->SizeOf(hex).status()));
  EXPECT_TRUE(store->Remove(hex).ok());  // absent is fine
}

TEST(BlobStoreTest, AReaderReadsAnyRangeAndOutlivesRemoval) {
  TempDir tmp;
  auto store = OpenStore(tmp.path());
  const std::string hex = *store->Put("0123456789");
  auto reader = store->OpenReader(hex);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->size(), 10);
  std::string bytes;
  ASSERT_TRUE((*reader)->ReadAt(3, 4, &bytes).ok());
  EXPECT_EQ(bytes, "3456");
  ASSERT_TRUE((*reader)->ReadAt(8, 100, &bytes).ok());
  EXPECT_EQ(bytes, "89");
  ASSERT_TRUE((*reader)->ReadAt(10, 5, &bytes).ok());
  EXPECT_EQ(bytes, "");
  EXPECT_TRUE(absl::IsInvalidArgument((*reader)->ReadAt(-1, 5, &bytes)));
  // A download in progress keeps its bytes when the blob goes.
  ASSERT_TRUE(store->Remove(hex).ok());
  ASSERT_TRUE((*reader)->ReadAt(0, 10, &bytes).ok());
  EXPECT_EQ(bytes, "0123456789");
  EXPECT_TRUE(absl::IsNotFound(store->OpenReader(hex).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store->OpenReader("../../etc/passwd").status()));
}

TEST(BlobStoreTest, UploadsOfTheSameBytesByTwoOwnersAreApartAndOwnersMustBeNames) {
  TempDir tmp;
  auto store = OpenStore(tmp.path());
  const std::string bytes = "twelve bytes";
  const std::string hex = Sha256Hex(bytes);
  ASSERT_TRUE(store->AppendUpload("a", hex, 0, bytes.substr(0, 5), bytes.size()).ok());
  EXPECT_EQ(*store->UploadedSize("a", hex), 5);
  EXPECT_EQ(*store->UploadedSize("b", hex), 0);  // b sees nothing of a's progress
  ASSERT_TRUE(store->AppendUpload("b", hex, 0, bytes, bytes.size()).ok());
  ASSERT_TRUE(store->CommitUpload("b", hex).ok());
  EXPECT_EQ(*store->UploadedSize("a", hex), 5);  // nor does b's commit take a's partial
  for (const std::string& owner : std::vector<std::string>{"", "..", ".", "../x", "a/b", std::string(65, 'a')}) {
    EXPECT_TRUE(absl::IsInvalidArgument(store->UploadedSize(owner, hex).status())) << owner;
    EXPECT_TRUE(absl::IsInvalidArgument(store->AppendUpload(owner, hex, 0, bytes, bytes.size()))) << owner;
  }
}

TEST(BlobStoreTest, RejectsDigestsThatAreNotLowercaseHex) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  const std::string good = Sha256Hex("x");
  std::string upper = good;
  upper[3] = 'A';
  for (const std::string& bad :
       {std::string("../x"), std::string("../../etc/passwd"), std::string(""), good.substr(0, 63), good + "0",
        upper, std::string(62, 'a') + "/.", std::string(64, 'g')}) {
    EXPECT_FALSE(store->Has(bad)) << bad;
    for (const absl::Status& s : {store->SizeOf(bad).status(), store->Remove(bad),
                                  store->UploadedSize("t", bad).status(), store->AppendUpload("t", bad, 0, "x", 1),
                                  store->CommitUpload("t", bad).status(), store->DiscardUpload("t", bad)}) {
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad << ": " << s;
    }
  }
  // Nothing was created outside (or inside) the uploads directory.
  EXPECT_FALSE(FileExists(dir.File("x")));
  EXPECT_FALSE(FileExists(dir.File("uploads/../x.partial")));
}

TEST(BlobStoreTest, UploadInChunksThenCommit) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  const std::string data = "the quick brown fox";
  const std::string hex = Sha256Hex(data);
  const int64_t n = static_cast<int64_t>(data.size());
  EXPECT_EQ(*store->UploadedSize("t", hex), 0);
  ASSERT_TRUE(store->AppendUpload("t", hex, 0, data.substr(0, 4), n).ok());
  ASSERT_TRUE(store->AppendUpload("t", hex, 4, data.substr(4, 6), n).ok());
  EXPECT_EQ(*store->UploadedSize("t", hex), 10);

  absl::Status wrong = store->AppendUpload("t", hex, 4, "xx", n);
  EXPECT_TRUE(absl::IsFailedPrecondition(wrong)) << wrong;
  EXPECT_NE(wrong.message().find("10"), absl::string_view::npos) << wrong;  // names the committed size

  absl::Status overflow = store->AppendUpload("t", hex, 10, data.substr(10) + "!", n);
  EXPECT_TRUE(absl::IsInvalidArgument(overflow)) << overflow;
  EXPECT_EQ(*store->UploadedSize("t", hex), 10);  // refused chunks leave nothing behind

  ASSERT_TRUE(store->AppendUpload("t", hex, 10, data.substr(10), n).ok());
  absl::StatusOr<std::string> path = store->CommitUpload("t", hex);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, store->PathOf(hex));
  EXPECT_EQ(ReadBytes(*path), data);
  EXPECT_EQ(*store->UploadedSize("t", hex), 0);
  // Committing again (say, after a crash before the reply) still succeeds.
  EXPECT_TRUE(store->CommitUpload("t", hex).ok());
}

TEST(BlobStoreTest, EmptyUploadCommits) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  const std::string hex = Sha256Hex("");
  ASSERT_TRUE(store->AppendUpload("t", hex, 0, "", 0).ok());
  ASSERT_TRUE(store->CommitUpload("t", hex).ok());
  EXPECT_EQ(*store->SizeOf(hex), 0);
}

TEST(BlobStoreTest, CommitWithWrongDigestDiscardsThePartial) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  const std::string claimed = Sha256Hex("what the client said");
  ASSERT_TRUE(store->AppendUpload("t", claimed, 0, "what it sent", 100).ok());
  absl::StatusOr<std::string> r = store->CommitUpload("t", claimed);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_NE(r.status().message().find(Sha256Hex("what it sent")), absl::string_view::npos);
  EXPECT_EQ(*store->UploadedSize("t", claimed), 0);
  EXPECT_FALSE(store->Has(claimed));
  EXPECT_TRUE(absl::IsNotFound(store->CommitUpload("t", claimed).status()));
}

TEST(BlobStoreTest, DiscardUpload) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  const std::string hex = Sha256Hex("abc");
  ASSERT_TRUE(store->AppendUpload("t", hex, 0, "ab", 3).ok());
  ASSERT_TRUE(store->DiscardUpload("t", hex).ok());
  EXPECT_EQ(*store->UploadedSize("t", hex), 0);
  EXPECT_TRUE(store->DiscardUpload("t", hex).ok());
  ASSERT_TRUE(store->AppendUpload("t", hex, 0, "abc", 3).ok());  // starts over from 0
}

TEST(BlobStoreTest, RacingAppendsAtTheSameOffsetCommitOnce) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  const std::string chunk(64 * 1024, 'z');
  const std::string hex = Sha256Hex(chunk);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      if (store->AppendUpload("t", hex, 0, chunk, static_cast<int64_t>(chunk.size())).ok()) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 1);
  EXPECT_EQ(*store->UploadedSize("t", hex), static_cast<int64_t>(chunk.size()));
  EXPECT_TRUE(store->CommitUpload("t", hex).ok());
}

TEST(BlobStoreTest, UploadResumesAfterReopen) {
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
  EXPECT_EQ(ReadBytes(*store->CommitUpload("t", hex)), data);
}

TEST(BlobStoreTest, UploadSurvivesAProcessThatDiesWithoutCleanup) {
  TempDir dir;
  const std::string data = "durable bytes";
  const std::string hex = Sha256Hex(data);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto store = BlobStore::Open(dir.path());
    const bool ok = store.ok() && (*store)->AppendUpload("t", hex, 0, data.substr(0, 7), 13).ok();
    ::_exit(ok ? 0 : 1);  // no destructors, no flushes
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto store = OpenStore(dir.path());
  EXPECT_EQ(*store->UploadedSize("t", hex), 7);
}

TEST(BlobStoreTest, AdoptFileMovesOrDropsDuplicates) {
  TempDir dir;
  auto store = OpenStore(dir.path());
  const std::string src = store->scratch_dir() + "/result.bin";
  WriteBytes(src, "engine output");
  absl::StatusOr<std::string> hex = store->AdoptFile(src);
  ASSERT_TRUE(hex.ok()) << hex.status();
  EXPECT_EQ(*hex, Sha256Hex("engine output"));
  EXPECT_FALSE(FileExists(src));
  EXPECT_EQ(ReadBytes(store->PathOf(*hex)), "engine output");

  WriteBytes(src, "engine output");  // the same result again
  EXPECT_EQ(*store->AdoptFile(src), *hex);
  EXPECT_FALSE(FileExists(src));
  EXPECT_EQ(ReadBytes(store->PathOf(*hex)), "engine output");

  absl::StatusOr<std::string> missing = store->AdoptFile(store->scratch_dir() + "/missing");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("missing"), absl::string_view::npos);
}

TEST(BlobStoreTest, OpenRefusesAFileWhereADirectoryShouldBe) {
  TempDir dir;
  WriteBytes(dir.File("uploads"), "not a dir");
  absl::StatusOr<std::unique_ptr<BlobStore>> store = BlobStore::Open(dir.path());
  EXPECT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("uploads"), absl::string_view::npos) << store.status();
}

}  // namespace
}  // namespace recal::store
