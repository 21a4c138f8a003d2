// What only the object-storage blob store does (server/store/s3_blob_store.h), against
// moto_server with authentication on (skipped, saying so, where it is not installed): where
// the objects go, the local cache and its verification, the errors of a missing bucket,
// refused credentials and a stopped endpoint, and --blobs parsing (open_blob_store.h).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "server/store/open_blob_store.h"
#include "server/store/s3_blob_store.h"
#include "tests/s3/moto_server.h"
#include "tests/s3/test_http_server.h"
#include "tests/store/shared_moto.h"
#include "tests/test_util.h"

namespace recal::store {
namespace {

using ::recal::testing::ReadBytes;
using ::recal::testing::TempDir;
using ::recal::testing::WriteBytes;

constexpr char kPrefix[] = "team/recal/";

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  return names;
}

class S3BlobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<const testing::SharedMoto*> moto = testing::Moto();
    if (absl::IsNotFound(moto.status())) GTEST_SKIP() << moto.status().message();
    ASSERT_TRUE(moto.ok()) << moto.status();
    moto_ = *moto;
    auto client = s3::S3Client::Create(Options());
    ASSERT_TRUE(client.ok()) << client.status();
    raw_ = *std::move(client);
    absl::StatusOr<std::string> bucket = testing::NewBucket(*raw_);
    ASSERT_TRUE(bucket.ok()) << bucket.status();
    bucket_ = *bucket;
  }

  s3::S3ClientOptions Options() const {
    return s3::testing::FastClientOptions(moto_->server->endpoint(), moto_->credentials);
  }

  std::unique_ptr<S3BlobStore> Open(s3::S3ClientOptions options, const std::string& bucket,
                                    int64_t cache_bytes = 0) {
    auto client = s3::S3Client::Create(std::move(options));
    EXPECT_TRUE(client.ok()) << client.status();
    S3BlobStoreOptions store_options;
    store_options.location = {bucket, kPrefix};
    store_options.local_dir = dir_.File("local");
    store_options.cache_bytes = cache_bytes;
    auto store = S3BlobStore::Open(*std::move(client), store_options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  std::unique_ptr<S3BlobStore> Open() { return Open(Options(), bucket_); }

  const testing::SharedMoto* moto_ = nullptr;
  std::unique_ptr<s3::S3Client> raw_;
  std::string bucket_;
  TempDir dir_;
};

TEST_F(S3BlobStoreTest, ABlobIsOneObjectNamedByThePrefixAndItsDigest) {
  auto store = Open();
  const std::string hex = *store->Put("model bytes");
  EXPECT_EQ(store->KeyOf(hex), absl::StrCat(kPrefix, "blobs/sha256/", hex));
  auto listed = raw_->ListObjects(bucket_, "");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].key, store->KeyOf(hex));
  EXPECT_EQ(*raw_->GetObjectRange(bucket_, store->KeyOf(hex), 0, 11), "model bytes");
  EXPECT_EQ(store->Describe(), absl::StrCat("s3://", bucket_, "/", kPrefix));
}

TEST_F(S3BlobStoreTest, LocalPathFetchesOnceIntoTheCacheAndRemoveDropsIt) {
  auto store = Open();
  const std::string hex = *store->Put("fetched once");
  const std::string target = absl::StrCat("/", bucket_, "/", store->KeyOf(hex));
  const int gets_before = s3::testing::CountRequests(moto_->server->log(), "GET", target);
  absl::StatusOr<std::string> path = store->LocalPath(hex);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, dir_.File("local/cache/sha256/" + hex));
  EXPECT_EQ(ReadBytes(*path), "fetched once");
  ASSERT_TRUE(store->LocalPath(hex).ok());
  absl::SleepFor(absl::Milliseconds(200));  // moto writes its log line after the reply
  EXPECT_EQ(s3::testing::CountRequests(moto_->server->log(), "GET", target), gets_before + 1);
  ASSERT_TRUE(store->Remove(hex).ok());
  EXPECT_FALSE(FileExists(*path));
  EXPECT_TRUE(absl::IsNotFound(store->LocalPath(hex).status()));
}

// Marks a cache entry as last used `age` ago (a test cannot wait out the cache's grace).
void Age(const std::string& path, absl::Duration age) {
  const timespec used = absl::ToTimespec(absl::Now() - age);
  const timespec times[2] = {used, used};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

TEST_F(S3BlobStoreTest, TheCacheKeepsToItsBoundButNeverDropsTheModelOfARunningJob) {
  auto store = Open(Options(), bucket_, 250);
  const std::string running = *store->Put(std::string(100, 'r'));
  const std::string idle = *store->Put(std::string(100, 'i'));
  const std::string next = *store->Put(std::string(100, 'n'));
  absl::StatusOr<BlobStore::HeldFile> held = store->HoldLocalPath(running);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(store->LocalPath(idle).ok());
  Age(held->path, absl::Hours(2));  // used longest ago, but held
  Age(dir_.File("local/cache/sha256/" + idle), absl::Hours(1));
  // 300 bytes once the third comes: the idle entry goes, the held one stays.
  ASSERT_TRUE(store->LocalPath(next).ok());
  EXPECT_TRUE(FileExists(held->path));
  EXPECT_FALSE(FileExists(dir_.File("local/cache/sha256/" + idle)));
  // Released, it is the one to go when the idle model is fetched again (verified as ever).
  held->hold.reset();
  Age(dir_.File("local/cache/sha256/" + next), absl::Minutes(30));
  absl::StatusOr<std::string> again = store->LocalPath(idle);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(ReadBytes(*again), std::string(100, 'i'));
  EXPECT_FALSE(FileExists(held->path));
  EXPECT_TRUE(FileExists(dir_.File("local/cache/sha256/" + next)));
  // The bucket keeps every blob: a dropped entry is only fetched again.
  EXPECT_TRUE(store->Has(running));
}

TEST_F(S3BlobStoreTest, ANegativeCacheBoundIsRefusedNamingTheFlag) {
  auto client = s3::S3Client::Create(Options());
  ASSERT_TRUE(client.ok()) << client.status();
  S3BlobStoreOptions store_options;
  store_options.location = {bucket_, kPrefix};
  store_options.local_dir = dir_.File("local");
  store_options.cache_bytes = -1;
  auto store = S3BlobStore::Open(*std::move(client), store_options);
  EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << store.status();
  EXPECT_NE(store.status().message().find("--blob_cache_bytes"), absl::string_view::npos) << store.status();
}

TEST_F(S3BlobStoreTest, AnObjectThatIsNotItsDigestNeverReachesTheCache) {
  auto store = Open();
  const std::string hex = Sha256Hex("the real bytes");
  ASSERT_TRUE(raw_->PutObject(bucket_, store->KeyOf(hex), "tampered bytes").ok());
  absl::StatusOr<std::string> path = store->LocalPath(hex);
  EXPECT_TRUE(absl::IsDataLoss(path.status())) << path.status();
  EXPECT_NE(path.status().message().find(store->KeyOf(hex)), absl::string_view::npos) << path.status();
  EXPECT_TRUE(FilesIn(dir_.File("local/cache/sha256")).empty());  // no entry, no temporary file
}

TEST_F(S3BlobStoreTest, AMissingBucketIsNotFoundNamingIt) {
  auto store = Open(Options(), "no-such-bucket-here");
  absl::Status probe = store->Probe();
  EXPECT_TRUE(absl::IsNotFound(probe)) << probe;
  EXPECT_NE(probe.message().find("no-such-bucket-here"), absl::string_view::npos) << probe;
  const std::string hex = Sha256Hex("x");
  EXPECT_TRUE(absl::IsNotFound(store->SizeOf(hex).status()));
  absl::Status fetched = store->LocalPath(hex).status();
  EXPECT_TRUE(absl::IsNotFound(fetched)) << fetched;
  EXPECT_NE(fetched.message().find("no-such-bucket-here"), absl::string_view::npos) << fetched;

  // The server does not start on it.
  auto opened = OpenBlobStore({.spec = "s3://no-such-bucket-here/p",
                               .data_dir = dir_.path(),
                               .object_storage = [this] { return Options(); }});
  EXPECT_TRUE(absl::IsNotFound(opened.status())) << opened.status();
  EXPECT_NE(opened.status().message().find("no-such-bucket-here"), absl::string_view::npos) << opened.status();
}

TEST_F(S3BlobStoreTest, RefusedCredentialsArePermissionDenied) {
  s3::S3ClientOptions options = Options();
  options.config.credentials.secret_access_key = "not-the-secret";
  auto store = Open(options, bucket_);
  EXPECT_TRUE(absl::IsPermissionDenied(store->Probe())) << store->Probe();
  EXPECT_TRUE(absl::IsPermissionDenied(store->Put("x").status()));
  const std::string src = store->scratch_dir() + "/result";
  WriteBytes(src, "result");
  EXPECT_TRUE(absl::IsPermissionDenied(store->AdoptFile(src).status()));
  EXPECT_TRUE(FileExists(src));  // kept: nothing was stored
}

TEST_F(S3BlobStoreTest, AStoppedEndpointIsUnavailableWithinBoundedTimeAndLosesNothing) {
  s3::S3ClientOptions options =
      s3::testing::FastClientOptions(absl::StrCat("http://127.0.0.1:", s3::testing::UnusedPort()), moto_->credentials);
  auto store = Open(options, bucket_);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(absl::IsUnavailable(store->Probe())) << store->Probe();

  // A result stays in scratch, an upload stays staged with its committed size: both can be
  // stored once the endpoint is back.
  const std::string src = store->scratch_dir() + "/result";
  WriteBytes(src, "result");
  EXPECT_TRUE(absl::IsUnavailable(store->AdoptFile(src).status()));
  EXPECT_EQ(ReadBytes(src), "result");
  const std::string hex = Sha256Hex("model");
  ASSERT_TRUE(store->AppendUpload("t", hex, 0, "model", 5).ok());
  EXPECT_TRUE(absl::IsUnavailable(store->CommitUpload("t", hex, 5).status()));
  EXPECT_EQ(*store->UploadedSize("t", hex), 5);
  EXPECT_TRUE(absl::IsUnavailable(store->LocalPath(hex).status()));
  EXPECT_TRUE(absl::IsUnavailable(store->OpenReader(hex).status()));
  EXPECT_FALSE(store->Has(hex));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));

  // The server starts anyway (the endpoint may come later), saying so.
  auto opened = OpenBlobStore(
      {.spec = "s3://" + bucket_ + "/p", .data_dir = dir_.path(), .object_storage = [&] { return options; }});
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(absl::IsUnavailable(opened->reachable)) << opened->reachable;
}

TEST(OpenBlobStoreTest, ChoosesTheBackendBySpecAndLooksUpCredentialsOnlyForABucket) {
  TempDir dir;
  int lookups = 0;
  auto object_storage = [&]() -> absl::StatusOr<s3::S3ClientOptions> {
    ++lookups;
    return absl::FailedPreconditionError("no credentials configured");
  };
  auto local = OpenBlobStore({.spec = "", .data_dir = dir.path(), .object_storage = object_storage});
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->store->Describe(), "file:" + dir.path());
  EXPECT_EQ(local->local_blob_dir, dir.path() + "/blobs");
  auto shared = OpenBlobStore({.spec = "file:" + dir.File("shared"), .data_dir = dir.path(), .object_storage = object_storage});
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->store->Describe(), "file:" + dir.File("shared"));
  EXPECT_EQ(lookups, 0);

  auto bucket = OpenBlobStore({.spec = "s3://bucket/p", .data_dir = dir.path(), .object_storage = object_storage});
  EXPECT_TRUE(absl::IsFailedPrecondition(bucket.status())) << bucket.status();
  EXPECT_EQ(lookups, 1);
  for (const char* bad : {"file:", "ftp://host/x", "/plain/dir", "s3://", "s3://Bad_Bucket/x", "s3://bucket/../x"}) {
    auto refused = OpenBlobStore({.spec = bad, .data_dir = dir.path(), .object_storage = object_storage});
    EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << bad << ": " << refused.status();
  }
  auto somewhere = []() -> absl::StatusOr<s3::S3ClientOptions> {
    s3::S3ClientOptions o;
    o.config.endpoint = *s3::ParseEndpoint("http://127.0.0.1:1");
    o.config.credentials = {"AKIAEXAMPLE", "secret", ""};
    return o;
  };
  auto small_parts =
      OpenBlobStore({.spec = "s3://bucket/p", .data_dir = dir.path(), .object_storage = somewhere, .part_bytes = 1 << 20});
  EXPECT_TRUE(absl::IsInvalidArgument(small_parts.status())) << small_parts.status();
}

}  // namespace
}  // namespace recal::store
