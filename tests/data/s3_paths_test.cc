// s3:// paths of data specs and s3:// data roots (server/data_access/s3_paths.h), and their place
// in ResolveUnderRoots (what the server checks at submit). No endpoint involved.
#include "server/data_access/s3_paths.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/data_access/data_roots.h"

namespace recal::data {
namespace {

using ::testing::HasSubstr;

TEST(S3Paths, ObjectPaths) {
  auto p = ParseS3ObjectPath("s3://bucket/a/b.npy");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->bucket, "bucket");
  EXPECT_EQ(p->key, "a/b.npy");
  EXPECT_EQ(p->ToString(), "s3://bucket/a/b.npy");
  EXPECT_EQ(ParseS3ObjectPath("s3://bucket/x %2e%2e:y.npy")->key, "x %2e%2e:y.npy");  // a key is literal
  for (const char* bad :
       {"s3://bucket/../x", "s3://bucket/a/../x", "s3://bucket/a/..", "s3://u:p@bucket/x", "s3://u@bucket/x",
        "s3://bucket:443/x", "s3://10.0.0.1/x", "s3://bucket//x", "s3://bucket/a//x", "s3://bucket/./x",
        "s3://bucket/x/", "s3://bucket/", "s3://bucket", "s3://", "s3:///x", "s3://bucket/x?y", "s3://bucket/x#y",
        "s3://bucket/a\\x", "s3://bucket/a\nx", "S3://bucket/x", "http://bucket/x", "/local/x.npy", ""}) {
    auto refused = ParseS3ObjectPath(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad << ": " << refused.status();
  }
  EXPECT_THAT(ParseS3ObjectPath("s3://u:p@bucket/x").status().message(), HasSubstr("bucket and a key only"));
}

TEST(S3Paths, FolderPaths) {
  EXPECT_EQ(ParseS3FolderPath("s3://bucket")->key, "");
  EXPECT_EQ(ParseS3FolderPath("s3://bucket/")->key, "");
  EXPECT_EQ(ParseS3FolderPath("s3://bucket/imgs")->key, "imgs/");
  EXPECT_EQ(ParseS3FolderPath("s3://bucket/a/imgs/")->key, "a/imgs/");
  for (const char* bad : {"s3://bucket/a/../imgs", "s3://bucket//imgs", "s3://bucket/imgs//", "s3://bucket/./imgs",
                          "s3://u@bucket/imgs", "s3://bucket:1/imgs"}) {
    EXPECT_EQ(ParseS3FolderPath(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(S3Paths, RootsMatchWholeSegmentsOfOneBucket) {
  const std::vector<std::string> roots = {"/data", "s3://bucket/sets", "s3://other/"};
  auto under = [&](const std::string& path) { return CheckS3UnderRoots(roots, *ParseS3FolderPath(path)).code(); };
  EXPECT_EQ(under("s3://bucket/sets/x.npy"), absl::StatusCode::kOk);
  EXPECT_EQ(under("s3://bucket/sets/a/b/"), absl::StatusCode::kOk);
  EXPECT_EQ(under("s3://bucket/sets"), absl::StatusCode::kOk);  // the root itself, as a folder
  EXPECT_EQ(under("s3://other/anything"), absl::StatusCode::kOk);
  EXPECT_EQ(under("s3://bucket/setsx/x.npy"), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(under("s3://bucket/x.npy"), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(under("s3://bucket2/sets/x.npy"), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckS3UnderRoots(roots, *ParseS3ObjectPath("s3://bucket/sets")).code(),
            absl::StatusCode::kPermissionDenied);  // the object "sets" is not under "sets/"
  EXPECT_EQ(CheckS3UnderRoots({"/data"}, *ParseS3ObjectPath("s3://bucket/sets/x")).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckS3UnderRoots({"s3://bad..bucket/"}, *ParseS3ObjectPath("s3://bucket/x")).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(S3Paths, ResolveUnderRootsChecksS3PathsAgainstS3RootsOnly) {
  const std::vector<std::string> roots = {"s3://bucket/sets/"};
  EXPECT_EQ(*ResolveUnderRoots(roots, "s3://bucket/sets/x.npy"), "s3://bucket/sets/x.npy");
  EXPECT_EQ(ResolveUnderRoots(roots, "s3://bucket/other/x.npy").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ResolveUnderRoots(roots, "s3://bucket/sets/../x.npy").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveUnderRoots({}, "s3://bucket/sets/x.npy").status().code(), absl::StatusCode::kPermissionDenied);
  // A local path is never under an s3:// root.
  EXPECT_EQ(ResolveUnderRoots(roots, "/etc/passwd").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ResolveUnderRoots(roots, "sets/x.npy").status().code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace recal::data
