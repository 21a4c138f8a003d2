// Data in a bucket (server/data/s3_sources.h) against moto_server, a real S3-compatible
// server started on loopback by the test (skipped, saying so, where moto_server is not on
// PATH), and against the scripted server of tests/s3 where a request must never be sent.
// The bar: the same batches, bit for bit, as the same files on local disk.
#include <ATen/ATen.h>

#include <filesystem>
#include <numeric>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/formats/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/data/batch_source.h"
#include "server/data_access/object_storage.h"
#include "server/data/s3_sources.h"
#include "tests/s3/moto_server.h"
#include "tests/s3/test_http_server.h"
#include "tests/test_util.h"

namespace recal::data {
namespace {

namespace fs = std::filesystem;
using ::recal::s3::testing::CountRequests;
using ::recal::s3::testing::FindOnPath;
using ::recal::s3::testing::MotoServer;
using ::recal::testing::BytesOf;
using ::recal::testing::NpyFile;
using ::recal::testing::TempDir;
using ::recal::testing::ViewOf;
using ::recal::testing::WriteBytes;
using ::testing::HasSubstr;

constexpr char kBucket[] = "recal-data";

s3::S3ClientOptions FastOptions(const std::string& endpoint, s3::Credentials creds = {"AKIAEXAMPLE", "unchecked", ""}) {
  return s3::testing::FastClientOptions(endpoint, std::move(creds));
}

std::vector<Batch> ReadAll(BatchSource& source) {
  std::vector<Batch> batches;
  for (int guard = 0; guard < 10000; ++guard) {
    absl::StatusOr<std::optional<Batch>> next = source.Next();
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) break;
    batches.push_back(**std::move(next));
  }
  return batches;
}

// Same count, and every tensor of every batch equal in dtype, shape and bytes.
void ExpectSameBatches(const std::vector<Batch>& want, const std::vector<Batch>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t b = 0; b < want.size(); ++b) {
    ASSERT_EQ(want[b].size(), got[b].size()) << what << " batch " << b;
    for (size_t i = 0; i < want[b].size(); ++i) {
      EXPECT_EQ(want[b][i].scalar_type(), got[b][i].scalar_type()) << what << " batch " << b;
      EXPECT_EQ(want[b][i].sizes(), got[b][i].sizes()) << what << " batch " << b;
      EXPECT_TRUE(want[b][i].is_contiguous() && got[b][i].is_contiguous());
      const size_t bytes = want[b][i].nbytes();
      EXPECT_TRUE(bytes == got[b][i].nbytes() &&
                  std::memcmp(want[b][i].data_ptr(), got[b][i].data_ptr(), bytes) == 0)
          << what << " batch " << b << " input " << i;
    }
  }
}

std::vector<float> Floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Lines of moto's log grow after the response is sent: wait until the count stops moving.
int SettledCount(const MotoServer& moto, const std::string& method, const std::string& target) {
  int last = -1;
  for (int i = 0; i < 50; ++i) {
    const int now = CountRequests(moto.log(), method, target);
    if (now == last) return now;
    last = now;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return last;
}

class S3SourcesMoto : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    binary_ = new std::string(FindOnPath("moto_server"));
    if (binary_->empty()) return;
    tmp_ = new TempDir;
    auto plain = MotoServer::Launch(*binary_, tmp_->File("moto.log"));
    auto auth = MotoServer::Launch(*binary_, tmp_->File("moto_auth.log"));
    if (!plain->Ready() || !auth->Ready()) {
      setup_error_ = new std::string("moto_server did not start; see its logs in " + tmp_->path());
      return;
    }
    moto_ = plain.release();
    moto_auth_ = auth.release();
    absl::StatusOr<s3::Credentials> creds = s3::testing::EnableAuth(moto_auth_->endpoint());
    if (!creds.ok()) {
      setup_error_ = new std::string(creds.status().ToString());
      return;
    }
    creds_ = new s3::Credentials(*std::move(creds));
  }
  static void TearDownTestSuite() {
    delete moto_;
    moto_ = nullptr;
    delete moto_auth_;
    moto_auth_ = nullptr;
    delete tmp_;
    tmp_ = nullptr;
  }

  void SetUp() override {
    if (binary_->empty()) GTEST_SKIP() << "moto_server not installed: data-in-a-bucket tests skipped";
    ASSERT_EQ(setup_error_, nullptr) << *setup_error_;
    auto c = s3::S3Client::Create(FastOptions(moto_->endpoint()));
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    ASSERT_TRUE(client_->CreateBucket(kBucket).ok());
  }

  InputOptions Options(int prefetch = 2) const {
    InputOptions o;
    o.prefetch_depth = prefetch;
    o.access.object_storage = *ConnectBucket(FastOptions(moto_->endpoint()));
    return o;
  }

  // Puts `bytes` at `key` and writes them to `local`.
  void Put(const std::string& key, const std::string& bytes, const std::string& local) {
    ASSERT_TRUE(client_->PutObject(kBucket, key, bytes).ok()) << key;
    if (!local.empty()) WriteBytes(local, bytes);
  }

  std::vector<Batch> ReadSpec(const std::string& spec, int64_t batch_size, const InputOptions& options) {
    auto source = OpenBatchSource(spec, batch_size, options);
    EXPECT_TRUE(source.ok()) << spec << ": " << source.status();
    return source.ok() ? ReadAll(**source) : std::vector<Batch>{};
  }

  static std::string* binary_;
  static std::string* setup_error_;
  static TempDir* tmp_;
  static MotoServer* moto_;
  static MotoServer* moto_auth_;
  static s3::Credentials* creds_;
  std::unique_ptr<s3::S3Client> client_;
  TempDir dir_;
};

std::string* S3SourcesMoto::binary_ = nullptr;
std::string* S3SourcesMoto::setup_error_ = nullptr;
TempDir* S3SourcesMoto::tmp_ = nullptr;
MotoServer* S3SourcesMoto::moto_ = nullptr;
MotoServer* S3SourcesMoto::moto_auth_ = nullptr;
s3::Credentials* S3SourcesMoto::creds_ = nullptr;

TEST_F(S3SourcesMoto, NpyFromABucketIsTheLocalFile) {
  // 37 samples of 3x5 float32: every batch size below leaves a partial last batch but 37.
  const std::string npy = NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (37, 3, 5), }",
                                  BytesOf(Floats(37 * 15, 1)));
  Put("sets/x.npy", npy, dir_.File("x.npy"));
  for (int64_t batch : {1, 4, 10, 37, 64}) {
    for (const std::string norm : {"", "?mean=0.5,0.25,0&std=2,1,0.5"}) {
      ExpectSameBatches(ReadSpec("npy:" + dir_.File("x.npy") + norm, batch, {}),
                        ReadSpec(absl::StrCat("npy:s3://", kBucket, "/sets/x.npy", norm), batch, Options()),
                        absl::StrCat("batch ", batch, norm));
    }
  }
  auto source = OpenBatchSource(absl::StrCat("npy:s3://", kBucket, "/sets/x.npy"), 8, Options());
  ASSERT_TRUE(source.ok());
  EXPECT_EQ((*source)->num_samples(), 37);
  EXPECT_THAT((*source)->Describe(), HasSubstr("npy:s3://recal-data/sets/x.npy (37 x 3x5 float32)"));
}

TEST_F(S3SourcesMoto, EachBatchIsOneRangedGetNotTheWholeObject) {
  const std::string npy = NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (37, 3, 5), }",
                                  BytesOf(Floats(37 * 15, 2)));
  Put("count/x.npy", npy, "");
  const std::string target = absl::StrCat("/", kBucket, "/count/x.npy");
  const int gets_before = SettledCount(*moto_, "GET", target);
  const int heads_before = SettledCount(*moto_, "HEAD", target);
  auto source = OpenBatchSource(absl::StrCat("npy:s3://", kBucket, "/count/x.npy"), 10, Options(0));
  ASSERT_TRUE(source.ok()) << source.status();
  // Opening: one HEAD (size, ETag) and one GET of the header.
  EXPECT_EQ(SettledCount(*moto_, "HEAD", target) - heads_before, 1);
  EXPECT_EQ(SettledCount(*moto_, "GET", target) - gets_before, 1);
  ASSERT_TRUE((*source)->Next().ok());
  EXPECT_EQ(SettledCount(*moto_, "GET", target) - gets_before, 2);
  EXPECT_EQ(ReadAll(**source).size(), 3u);  // 10 + 10 + 7 more samples
  EXPECT_EQ(SettledCount(*moto_, "GET", target) - gets_before, 5);

  // safetensors: one GET of the header, then one per key per batch; a shard skips without
  // reading.
  std::vector<float> a = Floats(23 * 4, 3);
  std::vector<int64_t> b(23);
  std::iota(b.begin(), b.end(), 100);
  const std::string path = dir_.File("t.safetensors");
  ASSERT_TRUE(formats::WriteSafetensors(path, {{"a", "F32", {23, 4}, ViewOf(a)}, {"b", "I64", {23}, ViewOf(b)}}).ok());
  Put("count/t.safetensors", recal::testing::ReadBytes(path), "");
  const std::string st_target = absl::StrCat("/", kBucket, "/count/t.safetensors");
  const int st_before = SettledCount(*moto_, "GET", st_target);
  auto shard = OpenBatchSourceShard(absl::StrCat("safetensors:s3://", kBucket, "/count/t.safetensors:b,a"), 5,
                                    Options(0), {.index = 1, .count = 2});
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(shard->range.first, 2);
  EXPECT_EQ(shard->range.count, 3);
  EXPECT_EQ(ReadAll(*shard->source).size(), 3u);
  EXPECT_EQ(SettledCount(*moto_, "GET", st_target) - st_before, 1 + 3 * 2);
}

TEST_F(S3SourcesMoto, SafetensorsAndShardsFromABucketAreTheLocalFile) {
  std::vector<float> a = Floats(23 * 4, 4);
  std::vector<int64_t> b(23);
  std::iota(b.begin(), b.end(), -5);
  std::vector<uint8_t> c(23 * 2 * 3);
  std::iota(c.begin(), c.end(), 0);
  const std::string path = dir_.File("t.safetensors");
  ASSERT_TRUE(formats::WriteSafetensors(path, {{"a", "F32", {23, 4}, ViewOf(a)},
                                               {"b", "I64", {23}, ViewOf(b)},
                                               {"c", "U8", {23, 2, 3}, ViewOf(c)}},
                                        {{"note", "a key with \"quotes\" and ':'"}})
                  .ok());
  Put("sets/t.safetensors", recal::testing::ReadBytes(path), "");
  for (const std::string keys : {"", ":b,a", ":c", ":a,b,c"}) {
    for (int64_t batch : {1, 5, 23, 30}) {
      ExpectSameBatches(ReadSpec("safetensors:" + path + keys, batch, {}),
                        ReadSpec(absl::StrCat("safetensors:s3://", kBucket, "/sets/t.safetensors", keys), batch,
                                 Options()),
                        absl::StrCat("keys '", keys, "' batch ", batch));
    }
  }
  // Shards: each starts at its first batch and ends after its count, as locally.
  for (int k = 0; k < 3; ++k) {
    const ShardPlan plan{.index = k, .count = 3};
    auto local = OpenBatchSourceShard("safetensors:" + path + ":a,c", 4, {}, plan);
    auto remote = OpenBatchSourceShard(absl::StrCat("safetensors:s3://", kBucket, "/sets/t.safetensors:a,c"), 4,
                                       Options(), plan);
    ASSERT_TRUE(local.ok() && remote.ok()) << local.status() << " " << remote.status();
    EXPECT_EQ(local->range.first, remote->range.first);
    ExpectSameBatches(ReadAll(*local->source), ReadAll(*remote->source), absl::StrCat("shard ", k));
  }
  // A missing key names what the file has, as locally.
  auto missing = OpenBatchSource(absl::StrCat("safetensors:s3://", kBucket, "/sets/t.safetensors:zz"), 4, Options());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("no tensor 'zz'"));
}

// Copies `from` (a local tree) to the bucket under `prefix`.
void Upload(s3::S3Client& client, const std::string& from, const std::string& prefix) {
  for (const auto& entry : fs::recursive_directory_iterator(from)) {
    if (!entry.is_regular_file()) continue;
    const std::string key = prefix + entry.path().lexically_relative(from).generic_string();
    ASSERT_TRUE(client.PutObject(kBucket, key, recal::testing::ReadBytes(entry.path().string())).ok()) << key;
  }
}

TEST_F(S3SourcesMoto, ImageFolderFromABucketIsTheLocalFolder) {
  ASSERT_EQ(recal::testing::MakeImageFolders(dir_.path()), 0);
  const fs::path imgs = fs::path(dir_.path()) / "root" / "imgs";
  // Names whose order and selection are easy to get wrong: '-' sorts before '/', upper
  // case before lower, a hidden folder is listed, ".png" alone has no extension, and a
  // folder named like an image is not a file.
  fs::create_directories(imgs / "a-b");
  fs::create_directories(imgs / ".hidden");
  fs::create_directories(imgs / "dir.png");
  fs::copy_file(imgs / "top.jpg", imgs / "a-b" / "x.jpg");
  fs::copy_file(imgs / "a" / "wide.png", imgs / ".hidden" / "Z.PNG");
  fs::copy_file(imgs / "c" / "palette.png", imgs / "dir.png" / "y.png");
  fs::copy_file(imgs / "top.jpg", imgs / "c" / ".png");
  Upload(*client_, imgs.string(), "imgs/");
  // What only a bucket can hold is left out: a folder marker, keys with an empty or "."
  // segment, and objects beside the prefix.
  ASSERT_TRUE(client_->PutObject(kBucket, "imgs/empty/", "").ok());
  ASSERT_TRUE(client_->PutObject(kBucket, "imgs/c//twice.png", recal::testing::ReadBytes((imgs / "top.jpg").string())).ok());
  ASSERT_TRUE(client_->PutObject(kBucket, "imgs2/other.png", recal::testing::ReadBytes((imgs / "top.jpg").string())).ok());

  const std::string options = "?resize=40&crop=32&mean=0.485,0.456,0.406&std=0.229,0.224,0.225";
  for (const std::string extra : {"", "&shuffle=1&seed=7", "&samples=5"}) {
    for (const std::string folder : {"s3://recal-data/imgs", "s3://recal-data/imgs/"}) {
      for (int64_t batch : {3, 4}) {
        InputOptions remote = Options();
        remote.decode_threads = 3;
        ExpectSameBatches(ReadSpec("images:" + imgs.string() + options + extra, batch, {.decode_threads = 1}),
                          ReadSpec("images:" + folder + options + extra, batch, remote),
                          absl::StrCat(folder, extra, " batch ", batch));
      }
    }
  }
  auto source = OpenBatchSource("images:s3://recal-data/imgs" + options, 4, Options());
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->num_samples(), recal::testing::kImageFolderImages + 3);  // not c/.png

  // A prefix without images.
  auto none = OpenBatchSource("images:s3://recal-data/nothing/" + options, 4, Options());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_THAT(none.status().message(), HasSubstr("s3://recal-data/nothing/"));
}

TEST_F(S3SourcesMoto, MissingBucketOrKeyIsNotFoundNamingIt) {
  auto key = OpenBatchSource(absl::StrCat("npy:s3://", kBucket, "/no/such.npy"), 4, Options());
  EXPECT_EQ(key.status().code(), absl::StatusCode::kNotFound) << key.status();
  EXPECT_THAT(key.status().message(), HasSubstr("s3://recal-data/no/such.npy"));
  auto bucket = OpenBatchSource("safetensors:s3://no-such-bucket/x.safetensors", 4, Options());
  EXPECT_EQ(bucket.status().code(), absl::StatusCode::kNotFound) << bucket.status();
  EXPECT_THAT(bucket.status().message(), HasSubstr("no-such-bucket"));
  auto folder = OpenBatchSource("images:s3://no-such-bucket/imgs?resize=4&crop=4&mean=0,0,0&std=1,1,1", 4, Options());
  EXPECT_EQ(folder.status().code(), absl::StatusCode::kNotFound) << folder.status();
  EXPECT_THAT(folder.status().message(), HasSubstr("no-such-bucket"));
}

TEST_F(S3SourcesMoto, OutsideTheS3RootsIsPermissionDenied) {
  const std::string npy = NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 2), }", BytesOf(Floats(8, 5)));
  Put("allowed/x.npy", npy, "");
  Put("allowedx/x.npy", npy, "");
  InputOptions o = Options();
  o.access.data_roots = {"/some/local/root", "s3://recal-data/allowed"};
  EXPECT_TRUE(OpenBatchSource("npy:s3://recal-data/allowed/x.npy", 2, o).ok());
  for (const std::string spec : {"npy:s3://recal-data/allowedx/x.npy", "npy:s3://recal-data/x.npy",
                                 "npy:s3://other-bucket/allowed/x.npy",
                                 "images:s3://recal-data/?resize=4&crop=4&mean=0,0,0&std=1,1,1"}) {
    auto denied = OpenBatchSource(spec, 2, o);
    EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << spec << ": " << denied.status();
  }
  // Only local roots: no s3:// data at all.
  o.access.data_roots = {"/some/local/root"};
  auto denied = OpenBatchSource("npy:s3://recal-data/allowed/x.npy", 2, o);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << denied.status();
  EXPECT_THAT(denied.status().message(), HasSubstr("no s3:// data roots"));
}

TEST_F(S3SourcesMoto, RefusedCredentialsArePermissionDenied) {
  auto c = s3::S3Client::Create(FastOptions(moto_auth_->endpoint(), *creds_));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->CreateBucket(kBucket).ok());
  ASSERT_TRUE((*c)->PutObject(kBucket, "x.npy", NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                                                        BytesOf(Floats(2, 6))))
                  .ok());
  InputOptions o;
  o.access.object_storage = *ConnectBucket(FastOptions(moto_auth_->endpoint(), *creds_));
  auto allowed = OpenBatchSource("npy:s3://recal-data/x.npy", 2, o);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ(ReadAll(**allowed).size(), 1u);
  o.access.object_storage = *ConnectBucket(FastOptions(moto_auth_->endpoint(), {creds_->access_key_id, "not-the-secret", ""}));
  auto denied = OpenBatchSource("npy:s3://recal-data/x.npy", 2, o);
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << denied.status();
}

TEST_F(S3SourcesMoto, AnObjectReplacedMidReadFailsInsteadOfMixingVersions) {
  const std::string v1 = NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (8, 2), }", BytesOf(Floats(16, 7)));
  const std::string v2 = NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (8, 2), }", BytesOf(Floats(16, 8)));
  Put("replaced.npy", v1, "");
  auto source = OpenBatchSource("npy:s3://recal-data/replaced.npy", 2, Options(0));
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_TRUE((*source)->Next().ok());
  Put("replaced.npy", v2, "");
  auto next = (*source)->Next();
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition) << next.status();
}

TEST_F(S3SourcesMoto, EndpointStoppedMidReadIsUnavailableWithinBoundedTime) {
  auto moto = MotoServer::Start(*binary_, tmp_->File("moto_stopped.log"));  // its own: this test stops it
  ASSERT_NE(moto, nullptr);
  auto c = s3::S3Client::Create(FastOptions(moto->endpoint()));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->CreateBucket(kBucket).ok());
  ASSERT_TRUE((*c)->PutObject(kBucket, "x.npy", NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (64, 4), }",
                                                        BytesOf(Floats(256, 9))))
                  .ok());
  InputOptions o;
  o.access.object_storage = *ConnectBucket(FastOptions(moto->endpoint()));
  // Without read-ahead, and with it (the prefetcher hands the status on).
  std::vector<std::unique_ptr<BatchSource>> sources;
  for (int prefetch : {0, 2}) {
    o.prefetch_depth = prefetch;
    auto source = OpenBatchSource("npy:s3://recal-data/x.npy", 4, o);
    ASSERT_TRUE(source.ok()) << source.status();
    ASSERT_TRUE((*source)->Next().ok());
    sources.push_back(*std::move(source));
  }
  moto->Stop();
  for (auto& source : sources) {
    const absl::Time start = absl::Now();
    absl::Status failed;
    for (int i = 0; i < 20 && failed.ok(); ++i) failed = source->Next().status();  // what was read ahead comes first
    EXPECT_LT(absl::Now() - start, absl::Seconds(15));
    EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
    EXPECT_THAT(failed.message(), HasSubstr(moto->endpoint()));
  }
  auto reopen = OpenBatchSource("npy:s3://recal-data/x.npy", 4, o);
  EXPECT_EQ(reopen.status().code(), absl::StatusCode::kUnavailable) << reopen.status();
}

// ---------------------------------------------------------------- no endpoint needed

TEST(S3Sources, HostileSpecsAreRefusedBeforeAnyRequest) {
  s3::testing::ScriptedHttpServer server;  // answers nothing useful; must hear nothing
  InputOptions o;
  o.access.object_storage = *ConnectBucket(FastOptions(server.endpoint()));
  for (const std::string spec : {
           "npy:s3://recal-data/../x.npy", "npy:s3://recal-data/a/../../x.npy", "npy:s3://user:pw@recal-data/x.npy",
           "npy:s3://user@recal-data/x.npy", "npy:s3://recal-data:9000/x.npy", "npy:s3://127.0.0.1/x.npy",
           "npy:s3://169.254.169.254/latest/meta-data", "npy:s3://recal-data/a//x.npy", "npy:s3://recal-data/./x.npy",
           "npy:s3://recal-data/x.npy#frag", "npy:s3://Recal-Data/x.npy", "npy:s3://recal-data/", "npy:s3://recal-data",
           "npy:s3:///x.npy", "npy:s3://recal-data/a\\..\\x.npy", "safetensors:s3://evil.example:80/x:k",
           "torch:s3://recal-data/x.pt", "images:s3://recal-data/a/../b/?resize=4&crop=4&mean=0,0,0&std=1,1,1",
           "images:s3://u@recal-data/?resize=4&crop=4&mean=0,0,0&std=1,1,1"}) {
    auto refused = OpenBatchSource(spec, 2, o);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << spec << ": " << refused.status();
  }
  EXPECT_TRUE(server.requests().empty());
}

TEST(S3Sources, WithoutObjectStorageS3SpecsAreFailedPrecondition) {
  for (const std::string spec : {"npy:s3://recal-data/x.npy", "safetensors:s3://recal-data/x.safetensors:a",
                                 "images:s3://recal-data/imgs/?resize=4&crop=4&mean=0,0,0&std=1,1,1"}) {
    auto refused = OpenBatchSource(spec, 2);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << spec << ": " << refused.status();
    EXPECT_THAT(refused.status().message(), HasSubstr("no object storage configured"));
  }
}

}  // namespace
}  // namespace recal::data
