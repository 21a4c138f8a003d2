// The BlobStore contract (server/store/blob_store.h), one suite run against every backend:
// LocalBlobStore on a temporary directory and S3BlobStore on moto_server (shared_moto.h; the
// S3 cases skip, saying so, where moto_server is not installed). What one backend does, the
// other must do too: the job and API layers cannot tell them apart.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "server/store/blob_store.h"
#include "server/store/local_blob_store.h"
#include "server/store/s3_blob_store.h"
#include "tests/store/shared_moto.h"
#include "tests/test_util.h"

namespace recal::store {
namespace {

using ::recal::testing::ReadBytes;
using ::recal::testing::TempDir;
using ::recal::testing::WriteBytes;

constexpr int64_t kPartBytes = int64_t{5} << 20;  // S3's smallest part: multipart from 5 MiB up

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

enum class Backend { kLocal, kS3 };

class BlobStoreConformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kLocal) {
      auto opened = LocalBlobStore::Open(dir_.File("blobs"));
      ASSERT_TRUE(opened.ok()) << opened.status();
      store_ = *std::move(opened);
      return;
    }
    absl::StatusOr<const testing::SharedMoto*> moto = testing::Moto();
    if (absl::IsNotFound(moto.status())) GTEST_SKIP() << moto.status().message();
    ASSERT_TRUE(moto.ok()) << moto.status();
    auto client = s3::S3Client::Create(s3::testing::FastClientOptions((*moto)->server->endpoint(), (*moto)->credentials));
    ASSERT_TRUE(client.ok()) << client.status();
    absl::StatusOr<std::string> bucket = testing::NewBucket(**client);
    ASSERT_TRUE(bucket.ok()) << bucket.status();
    S3BlobStoreOptions options;
    options.location = {*bucket, "some/prefix/"};
    options.local_dir = dir_.File("local");
    options.part_bytes = kPartBytes;
    options.read_ahead_bytes = 1 << 20;
    auto opened = S3BlobStore::Open(*std::move(client), options);
    ASSERT_TRUE(opened.ok()) << opened.status();
    ASSERT_TRUE((*opened)->Probe().ok()) << (*opened)->Probe();
    store_ = *std::move(opened);
  }

  std::string ReadAll(const std::string& hex) {
    auto reader = store_->OpenReader(hex);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return "";
    std::string bytes;
    EXPECT_TRUE((*reader)->ReadAt(0, (*reader)->size(), &bytes).ok());
    return bytes;
  }

  TempDir dir_;
  std::unique_ptr<BlobStore> store_;
};

TEST_P(BlobStoreConformance, PutHasSizeReadRemove) {
  const std::string hex = *store_->Put("hello");
  EXPECT_EQ(hex, Sha256Hex("hello"));
  EXPECT_TRUE(store_->Has(hex));
  EXPECT_EQ(*store_->SizeOf(hex), 5);
  EXPECT_EQ(ReadAll(hex), "hello");
  absl::StatusOr<std::string> local = store_->LocalPath(hex);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(ReadBytes(*local), "hello");
  EXPECT_EQ(*store_->Put("hello"), hex);  // same bytes, same blob

  ASSERT_TRUE(store_->Remove(hex).ok());
  EXPECT_FALSE(store_->Has(hex));
  for (const absl::Status& s :
       {store_->SizeOf(hex).status(), store_->OpenReader(hex).status(), store_->LocalPath(hex).status()}) {
    EXPECT_TRUE(absl::IsNotFound(s)) << s;
    EXPECT_NE(s.message().find(hex), absl::string_view::npos) << s;  // names the blob
  }
  EXPECT_TRUE(store_->Remove(hex).ok());  // absent is fine
}

TEST_P(BlobStoreConformance, AReaderReadsAnyRange) {
  // Larger than a read-ahead window, so that reads cross windows both ways.
  const std::string bytes = RandomBytes((3 << 20) + 12345, 1);
  const std::string hex = *store_->Put(bytes);
  auto reader = store_->OpenReader(hex);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->size(), static_cast<int64_t>(bytes.size()));
  std::string got;
  std::mt19937 rng(2);
  for (int i = 0; i < 40; ++i) {
    const int64_t offset = static_cast<int64_t>(rng() % bytes.size());
    const int64_t length = static_cast<int64_t>(rng() % (2 << 20));
    ASSERT_TRUE((*reader)->ReadAt(offset, length, &got).ok());
    ASSERT_EQ(got, bytes.substr(offset, length)) << "at " << offset << " for " << length;
  }
  ASSERT_TRUE((*reader)->ReadAt(static_cast<int64_t>(bytes.size()) - 2, 100, &got).ok());
  EXPECT_EQ(got, bytes.substr(bytes.size() - 2));
  ASSERT_TRUE((*reader)->ReadAt(static_cast<int64_t>(bytes.size()), 5, &got).ok());
  EXPECT_EQ(got, "");
  ASSERT_TRUE((*reader)->ReadAt(static_cast<int64_t>(bytes.size()) + 7, 5, &got).ok());
  EXPECT_EQ(got, "");
  EXPECT_TRUE(absl::IsInvalidArgument((*reader)->ReadAt(-1, 5, &got)));
}

TEST_P(BlobStoreConformance, RejectsDigestsThatAreNotLowercaseHex) {
  const std::string good = Sha256Hex("x");
  std::string upper = good;
  upper[3] = 'A';
  for (const std::string& bad :
       {std::string("../x"), std::string("../../etc/passwd"), std::string(""), good.substr(0, 63), good + "0",
        upper, std::string(62, 'a') + "/.", std::string(64, 'g'), "?list-type=2&" + good.substr(13)}) {
    EXPECT_FALSE(store_->Has(bad)) << bad;
    for (const absl::Status& s :
         {store_->SizeOf(bad).status(), store_->OpenReader(bad).status(), store_->LocalPath(bad).status(),
          store_->Remove(bad), store_->UploadedSize("t", bad).status(), store_->AppendUpload("t", bad, 0, "x", 1),
          store_->CommitUpload("t", bad, 1).status(), store_->DiscardUpload("t", bad)}) {
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad << ": " << s;
    }
  }
  EXPECT_FALSE(FileExists(dir_.File("x")));
}

TEST_P(BlobStoreConformance, UploadsOfTheSameBytesByTwoOwnersAreApartAndOwnersMustBeNames) {
  const std::string bytes = "twelve bytes";
  const std::string hex = Sha256Hex(bytes);
  ASSERT_TRUE(store_->AppendUpload("a", hex, 0, bytes.substr(0, 5), bytes.size()).ok());
  EXPECT_EQ(*store_->UploadedSize("a", hex), 5);
  EXPECT_EQ(*store_->UploadedSize("b", hex), 0);  // b sees nothing of a's progress
  ASSERT_TRUE(store_->AppendUpload("b", hex, 0, bytes, bytes.size()).ok());
  ASSERT_TRUE(store_->CommitUpload("b", hex, bytes.size()).ok());
  EXPECT_EQ(*store_->UploadedSize("a", hex), 5);  // nor does b's commit take a's partial
  for (const std::string& owner : std::vector<std::string>{"", "..", ".", "../x", "a/b", std::string(65, 'a')}) {
    EXPECT_TRUE(absl::IsInvalidArgument(store_->UploadedSize(owner, hex).status())) << owner;
    EXPECT_TRUE(absl::IsInvalidArgument(store_->AppendUpload(owner, hex, 0, bytes, bytes.size()))) << owner;
  }
}

TEST_P(BlobStoreConformance, UploadInChunksThenCommit) {
  const std::string data = "the quick brown fox";
  const std::string hex = Sha256Hex(data);
  const int64_t n = static_cast<int64_t>(data.size());
  EXPECT_EQ(*store_->UploadedSize("t", hex), 0);
  ASSERT_TRUE(store_->AppendUpload("t", hex, 0, data.substr(0, 4), n).ok());
  ASSERT_TRUE(store_->AppendUpload("t", hex, 4, data.substr(4, 6), n).ok());
  EXPECT_EQ(*store_->UploadedSize("t", hex), 10);
  EXPECT_FALSE(store_->Has(hex));  // nothing of an upload is a blob before its commit

  absl::Status ahead = store_->AppendUpload("t", hex, 12, data.substr(12), n);
  EXPECT_TRUE(absl::IsFailedPrecondition(ahead)) << ahead;
  EXPECT_NE(ahead.message().find("resume at offset 10"), absl::string_view::npos) << ahead;
  // Bytes below the committed size, sent again (another client of the same upload): kept as they were.
  EXPECT_TRUE(store_->AppendUpload("t", hex, 4, data.substr(4, 2), n).ok());
  EXPECT_EQ(*store_->UploadedSize("t", hex), 10);

  absl::Status overflow = store_->AppendUpload("t", hex, 10, data.substr(10) + "!", n);
  EXPECT_TRUE(absl::IsInvalidArgument(overflow)) << overflow;
  EXPECT_EQ(*store_->UploadedSize("t", hex), 10);  // refused chunks leave nothing behind

  ASSERT_TRUE(store_->AppendUpload("t", hex, 10, data.substr(10), n).ok());
  absl::StatusOr<std::string> path = store_->CommitUpload("t", hex, n);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, *store_->LocalPath(hex));
  EXPECT_EQ(ReadBytes(*path), data);
  EXPECT_EQ(ReadAll(hex), data);
  EXPECT_EQ(*store_->UploadedSize("t", hex), 0);
  // Committing again (say, after a crash before the reply) still succeeds.
  absl::StatusOr<std::string> again = store_->CommitUpload("t", hex, n);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ReadBytes(*again), data);
}

TEST_P(BlobStoreConformance, ACommitRacingANewUploadOfStoredBytesSucceedsAndLeavesItAlone) {
  // One client's commit stored the blob; another, finding nothing staged, began anew: its
  // partial file is empty or holds a first chunk when a third client, whose upload was the
  // complete one, commits. That commit succeeds and the new upload is not called corrupt.
  const std::string data = "stored already";
  const std::string hex = Sha256Hex(data);
  const int64_t n = static_cast<int64_t>(data.size());
  ASSERT_TRUE(store_->AppendUpload("t", hex, 0, data, n).ok());
  ASSERT_TRUE(store_->CommitUpload("t", hex, n).ok());
  for (const int64_t begun : {int64_t{0}, int64_t{6}}) {
    SCOPED_TRACE(begun);
    ASSERT_TRUE(store_->AppendUpload("t", hex, 0, data.substr(0, begun), n).ok());
    absl::StatusOr<std::string> again = store_->CommitUpload("t", hex, n);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(ReadBytes(*again), data);
    // The new upload goes on where it was.
    ASSERT_EQ(*store_->UploadedSize("t", hex), begun);
    ASSERT_TRUE(store_->AppendUpload("t", hex, begun, data.substr(begun), n).ok());
    EXPECT_TRUE(store_->CommitUpload("t", hex, n).ok());
  }
}

TEST_P(BlobStoreConformance, ACommitOfAnIncompleteUploadIsRefusedNamingWhereToResumeAndKeepsIt) {
  const std::string data = "not all here";
  const std::string hex = Sha256Hex(data);
  const int64_t n = static_cast<int64_t>(data.size());
  absl::StatusOr<std::string> nothing = store_->CommitUpload("t", hex, n);
  EXPECT_TRUE(absl::IsFailedPrecondition(nothing.status())) << nothing.status();
  EXPECT_NE(nothing.status().message().find("resume from 0"), absl::string_view::npos) << nothing.status();
  ASSERT_TRUE(store_->AppendUpload("t", hex, 0, data.substr(0, 4), n).ok());
  absl::StatusOr<std::string> part = store_->CommitUpload("t", hex, n);
  EXPECT_TRUE(absl::IsFailedPrecondition(part.status())) << part.status();
  EXPECT_NE(part.status().message().find("4 of 12 bytes committed; resume from 4"), absl::string_view::npos)
      << part.status();
  EXPECT_EQ(*store_->UploadedSize("t", hex), 4);
  EXPECT_FALSE(store_->Has(hex));
}

TEST_P(BlobStoreConformance, EmptyUploadCommits) {
  const std::string hex = Sha256Hex("");
  ASSERT_TRUE(store_->AppendUpload("t", hex, 0, "", 0).ok());
  ASSERT_TRUE(store_->CommitUpload("t", hex, 0).ok());
  EXPECT_EQ(*store_->SizeOf(hex), 0);
  EXPECT_EQ(ReadAll(hex), "");
}

TEST_P(BlobStoreConformance, CommitWithWrongDigestDiscardsThePartial) {
  const std::string claimed = Sha256Hex("what the client said");
  ASSERT_TRUE(store_->AppendUpload("t", claimed, 0, "what it sent", 12).ok());
  absl::StatusOr<std::string> r = store_->CommitUpload("t", claimed, 12);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_NE(r.status().message().find(Sha256Hex("what it sent")), absl::string_view::npos);
  EXPECT_EQ(*store_->UploadedSize("t", claimed), 0);
  EXPECT_FALSE(store_->Has(claimed));
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->CommitUpload("t", claimed, 12).status()));
}

TEST_P(BlobStoreConformance, DiscardUpload) {
  const std::string hex = Sha256Hex("abc");
  ASSERT_TRUE(store_->AppendUpload("t", hex, 0, "ab", 3).ok());
  ASSERT_TRUE(store_->DiscardUpload("t", hex).ok());
  EXPECT_EQ(*store_->UploadedSize("t", hex), 0);
  EXPECT_TRUE(store_->DiscardUpload("t", hex).ok());
  ASSERT_TRUE(store_->AppendUpload("t", hex, 0, "abc", 3).ok());  // starts over from 0
}

// Four clients send the same bytes in chunks of different sizes at once: every chunk is
// taken (its new bytes, if any, written once), and the upload is whole and commits.
TEST_P(BlobStoreConformance, ClientsRacingOverTheSameUploadAllSucceedAndWriteEachByteOnce) {
  const std::string chunk = RandomBytes(64 * 1024, 7);
  const std::string hex = Sha256Hex(chunk);
  const int64_t n = static_cast<int64_t>(chunk.size());
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const int64_t step = 1000 * (t + 1) + 17;
      for (int64_t at = 0; at < n; at += step) {
        if (!store_->AppendUpload("t", hex, at, chunk.substr(at, step), n).ok()) ++refused;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(refused.load(), 0);
  EXPECT_EQ(*store_->UploadedSize("t", hex), n);
  EXPECT_TRUE(store_->CommitUpload("t", hex, static_cast<int64_t>(chunk.size())).ok());
}

TEST_P(BlobStoreConformance, AdoptFileTakesTheFileOrDropsADuplicate) {
  const std::string src = store_->scratch_dir() + "/result.bin";
  WriteBytes(src, "engine output");
  absl::StatusOr<std::string> hex = store_->AdoptFile(src);
  ASSERT_TRUE(hex.ok()) << hex.status();
  EXPECT_EQ(*hex, Sha256Hex("engine output"));
  EXPECT_FALSE(FileExists(src));
  EXPECT_EQ(ReadAll(*hex), "engine output");

  WriteBytes(src, "engine output");  // the same result again
  EXPECT_EQ(*store_->AdoptFile(src), *hex);
  EXPECT_FALSE(FileExists(src));
  EXPECT_EQ(ReadAll(*hex), "engine output");

  absl::StatusOr<std::string> missing = store_->AdoptFile(store_->scratch_dir() + "/missing");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("missing"), absl::string_view::npos);
}

TEST_P(BlobStoreConformance, AdoptFileRefusesLinks) {
  const std::string secret = dir_.File("secret");
  WriteBytes(secret, "not the worker's to give");
  const std::string symlink = store_->scratch_dir() + "/symlink";
  const std::string hardlink = store_->scratch_dir() + "/hardlink";
  ASSERT_EQ(::symlink(secret.c_str(), symlink.c_str()), 0);
  ASSERT_EQ(::link(secret.c_str(), hardlink.c_str()), 0);
  for (const std::string& path : {symlink, hardlink}) {
    absl::StatusOr<std::string> adopted = store_->AdoptFile(path);
    EXPECT_TRUE(absl::IsFailedPrecondition(adopted.status())) << path << ": " << adopted.status();
  }
  EXPECT_FALSE(store_->Has(Sha256Hex("not the worker's to give")));
}

TEST_P(BlobStoreConformance, ABlobLargerThanAMultipartPartRoundTrips) {
  // Two full parts and a short last one in a bucket; one file either way.
  const std::string bytes = RandomBytes(2 * kPartBytes + 4321, 3);
  const std::string src = store_->scratch_dir() + "/model.pt";
  WriteBytes(src, bytes);
  absl::StatusOr<std::string> hex = store_->AdoptFile(src);
  ASSERT_TRUE(hex.ok()) << hex.status();
  EXPECT_EQ(*hex, Sha256Hex(bytes));
  EXPECT_EQ(*store_->SizeOf(*hex), static_cast<int64_t>(bytes.size()));
  absl::StatusOr<std::string> local = store_->LocalPath(*hex);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*Sha256OfFile(*local), *hex);
  EXPECT_EQ(ReadAll(*hex), bytes);
}

TEST_P(BlobStoreConformance, ALargeUploadCommitsWhole) {
  const std::string bytes = RandomBytes(kPartBytes + 1000, 4);
  const std::string hex = Sha256Hex(bytes);
  const int64_t n = static_cast<int64_t>(bytes.size());
  for (int64_t offset = 0; offset < n; offset += 1 << 20) {
    ASSERT_TRUE(store_->AppendUpload("t", hex, offset, bytes.substr(offset, 1 << 20), n).ok());
  }
  absl::StatusOr<std::string> path = store_->CommitUpload("t", hex, n);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*Sha256OfFile(*path), hex);
  EXPECT_EQ(*store_->SizeOf(hex), n);
}

TEST_P(BlobStoreConformance, ScratchDirIsLocalAndWritable) {
  const std::string file = store_->scratch_dir() + "/probe";
  WriteBytes(file, "x");
  EXPECT_EQ(ReadBytes(file), "x");
}

// Abandoned uploads hold disk until they expire: counted per owner while they exist, removed
// once idle past the cutoff (and only then), the way a sweeper after a restart finds them.
TEST_P(BlobStoreConformance, UnfinishedUploadsAreCountedPerOwnerAndExpireOnlyOnceIdle) {
  const std::string a = RandomBytes(1000, 7), b = RandomBytes(300, 8);
  ASSERT_TRUE(store_->AppendUpload("t", Sha256Hex(a), 0, a.substr(0, 600), 1000).ok());
  ASSERT_TRUE(store_->AppendUpload("t", Sha256Hex(b), 0, b.substr(0, 100), 300).ok());
  ASSERT_TRUE(store_->AppendUpload("u", Sha256Hex(a), 0, a.substr(0, 10), 1000).ok());
  absl::StatusOr<UploadUsage> t = store_->UploadUsageOf("t");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->uploads, 2);
  EXPECT_EQ(t->bytes, 700);
  EXPECT_EQ(store_->UploadUsageOf("nobody")->uploads, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(store_->UploadUsageOf("../t").status()));
  absl::StatusOr<std::map<std::string, UploadUsage>> all = store_->UploadUsageByOwner();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ(all->at("u").bytes, 10);

  // Appended to just now: not idle since an hour ago.
  EXPECT_EQ(*store_->ExpireUploads(absl::Now() - absl::Hours(1)), 0);
  EXPECT_EQ(*store_->UploadedSize("t", Sha256Hex(a)), 600);
  // Idle since a cutoff in the future: every one goes.
  EXPECT_EQ(*store_->ExpireUploads(absl::Now() + absl::Minutes(1)), 3);
  EXPECT_EQ(store_->UploadUsageOf("t")->bytes, 0);
  EXPECT_TRUE(store_->UploadUsageByOwner()->empty());
  // The client resuming an expired upload is told to start over.
  absl::Status resumed = store_->AppendUpload("t", Sha256Hex(a), 600, a.substr(600), 1000);
  EXPECT_TRUE(absl::IsFailedPrecondition(resumed)) << resumed;
  EXPECT_NE(resumed.message().find("resume at offset 0"), absl::string_view::npos) << resumed;
  EXPECT_EQ(*store_->ExpireUploads(absl::Now() + absl::Minutes(1)), 1);  // the file that append made
}

INSTANTIATE_TEST_SUITE_P(Backends, BlobStoreConformance, ::testing::Values(Backend::kLocal, Backend::kS3),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param == Backend::kLocal ? std::string("local") : std::string("s3");
                         });

}  // namespace
}  // namespace recal::store
