// What a spec in a bucket reads (server/data_access/locate_objects.h), against a bucket in
// memory that counts what it is asked: the checks that come before any request, and the
// image folder's selection of listed keys. Against a real S3 endpoint: s3_sources_test.cc.
#include "server/data_access/locate_objects.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recal::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Keys and sizes in one bucket, "bkt"; reads are not this test's concern.
class CountingBucket final : public ObjectStorage {
 public:
  explicit CountingBucket(std::map<std::string, int64_t> sizes) : sizes_(std::move(sizes)) {}
  int requests() const { return requests_; }

  absl::StatusOr<s3::ObjectInfo> Stat(const std::string& bucket, const std::string& key) override {
    ++requests_;
    auto found = sizes_.find(key);
    if (bucket != "bkt" || found == sizes_.end()) return absl::NotFoundError(absl::StrCat("no s3://", bucket, "/", key));
    return s3::ObjectInfo{key, found->second, "etag"};
  }
  absl::StatusOr<std::vector<s3::ObjectInfo>> List(const std::string& bucket, const std::string& prefix) override {
    ++requests_;
    std::vector<s3::ObjectInfo> listed;
    for (const auto& [key, size] : sizes_) {
      if (key.rfind(prefix, 0) == 0) listed.push_back({key, size, "etag"});
    }
    return listed;
  }
  absl::Status Read(const std::string&, const s3::ObjectInfo&, int64_t, absl::Span<char>) override {
    return absl::UnimplementedError("not read here");
  }

 private:
  const std::map<std::string, int64_t> sizes_;
  int requests_ = 0;
};

DataSpec Parsed(const std::string& spec) {
  absl::StatusOr<DataSpec> parsed = ParseDataSpec(spec);
  EXPECT_TRUE(parsed.ok()) << spec << ": " << parsed.status();
  return parsed.ok() ? *parsed : DataSpec();
}

constexpr char kImageOptions[] = "?resize=8&crop=8&mean=0,0,0&std=1,1,1";

TEST(LocateObjects, OnlyPathsInABucketReadObjectStorage) {
  EXPECT_TRUE(ReadsObjectStorage(Parsed("npy:s3://bkt/x.npy")));
  EXPECT_TRUE(ReadsObjectStorage(Parsed(absl::StrCat("images:s3://bkt/d/", kImageOptions))));
  EXPECT_FALSE(ReadsObjectStorage(Parsed("npy:/data/x.npy")));
  EXPECT_FALSE(ReadsObjectStorage(Parsed("synthetic:3x4")));
}

TEST(LocateObjects, ATensorFileIsOneObject) {
  auto bucket = std::make_shared<CountingBucket>(std::map<std::string, int64_t>{{"d/x.npy", 128}});
  auto located = LocateObjects(Parsed("npy:s3://bkt/d/x.npy"), {.data_roots = {"s3://bkt/d"}, .object_storage = bucket});
  ASSERT_TRUE(located.ok()) << located.status();
  EXPECT_EQ(located->bucket, "bkt");
  ASSERT_EQ(located->objects.size(), 1u);
  EXPECT_EQ(located->objects[0].size, 128);
  auto missing = LocateObjects(Parsed("npy:s3://bkt/d/y.npy"), {.object_storage = bucket});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("npy:s3://bkt/d/y.npy"));
}

TEST(LocateObjects, AnImageFolderIsItsImagesUnderPlainPaths) {
  auto bucket = std::make_shared<CountingBucket>(std::map<std::string, int64_t>{
      {"d/a.jpg", 1}, {"d/b/c.PNG", 2}, {"d/notes.txt", 3}, {"d//twice.jpg", 4}, {"d/./dot.jpg", 5},
      {"d/../up.jpg", 6}, {"db/other.jpg", 7}});
  auto located = LocateObjects(Parsed(absl::StrCat("images:s3://bkt/d/", kImageOptions)), {.object_storage = bucket});
  ASSERT_TRUE(located.ok()) << located.status();
  std::vector<std::string> keys;
  for (const s3::ObjectInfo& object : located->objects) keys.push_back(object.key);
  EXPECT_THAT(keys, ElementsAre("d/a.jpg", "d/b/c.PNG"));
  EXPECT_EQ(bucket->requests(), 1) << "one listing";
}

TEST(LocateObjects, RefusedBeforeAnyRequest) {
  auto bucket = std::make_shared<CountingBucket>(std::map<std::string, int64_t>{{"d/x.npy", 8}});
  const DataAccess confined{.data_roots = {"/local/root", "s3://bkt/other"}, .object_storage = bucket};
  EXPECT_EQ(LocateObjects(Parsed("npy:s3://bkt/d/x.npy"), confined).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(LocateObjects(Parsed("torch:s3://bkt/d/x.pt"), {.object_storage = bucket}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LocateObjects(Parsed("npy:s3://bkt/d/x.npy/"), {.object_storage = bucket}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bucket->requests(), 0);
  auto unconfigured = LocateObjects(Parsed("npy:s3://bkt/d/x.npy"), {});
  EXPECT_EQ(unconfigured.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(unconfigured.status().message(), HasSubstr("no object storage configured"));
}

}  // namespace
}  // namespace recal::data
