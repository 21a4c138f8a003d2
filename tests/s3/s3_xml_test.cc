// The expat parsers of S3's XML answers (server/s3/s3_xml.cc): real-shaped documents,
// and the hostile ones an endpoint (or a man in the middle of plain HTTP) could send.
#include "server/s3/s3_xml.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace recal::s3 {
namespace {

TEST(S3Xml, ListBucketResult) {
  const char xml[] = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>bucket</Name><Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <Contents><Key>p/a &amp; b.npy</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified>
    <ETag>&quot;d41d8cd98f00b204e9800998ecf8427e&quot;</ETag><Size>0</Size><StorageClass>STANDARD</StorageClass></Contents>
  <Contents><Key> p/sp </Key><ETag>"abc-2"</ETag><Size>10485760</Size></Contents>
  <CommonPrefixes><Prefix>p/dir/</Prefix></CommonPrefixes>
  <NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken>
</ListBucketResult>)";
  auto page = ParseListBucketResult(xml);
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0], (ObjectInfo{"p/a & b.npy", 0, "d41d8cd98f00b204e9800998ecf8427e"}));
  EXPECT_EQ(page->objects[1], (ObjectInfo{" p/sp ", 10485760, "abc-2"}));  // spaces in keys are kept
  EXPECT_TRUE(page->is_truncated);
  EXPECT_EQ(page->next_continuation_token, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
  EXPECT_EQ(page->common_prefixes, std::vector<std::string>{"p/dir/"});

  auto empty = ParseListBucketResult("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->objects.empty());
  EXPECT_FALSE(empty->is_truncated);
}

TEST(S3Xml, ListBucketResultRefusals) {
  for (const char* bad : {
           "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",                // no key
           "<ListBucketResult><Contents><Key>k</Key></Contents></ListBucketResult>",                  // no size
           "<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>",   // negative
           "<ListBucketResult><Contents><Key>k</Key><Size>1e3</Size></Contents></ListBucketResult>",  // not an int
           "<ListBucketResult><Contents><Key>k</Key><Size>99999999999999999999</Size></Contents></ListBucketResult>",
           "<ListBucketResult><IsTruncated>maybe</IsTruncated></ListBucketResult>",
           "<Other/>",
           "<ListBucketResult>",  // unterminated
           "",
           "not xml",
       }) {
    auto page = ParseListBucketResult(bad);
    EXPECT_EQ(page.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_FALSE(page.status().message().empty());
  }
}

TEST(S3Xml, RefusesDoctypeEntitiesDepthAndSize) {
  const std::string laughs =
      "<?xml version=\"1.0\"?><!DOCTYPE lolz [<!ENTITY lol \"lol\"><!ENTITY lol2 \"&lol;&lol;&lol;&lol;\">]>"
      "<Error><Code>&lol2;</Code></Error>";
  auto e = ParseErrorBody(laughs);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(e.status().message(), "DOCTYPE")) << e.status();

  const std::string external = "<!DOCTYPE Error SYSTEM \"file:///etc/passwd\"><Error><Code>x</Code></Error>";
  EXPECT_FALSE(ParseErrorBody(external).ok());

  std::string deep;
  for (int i = 0; i < 40; ++i) deep += "<a>";
  for (int i = 0; i < 40; ++i) deep += "</a>";
  auto d = ParseErrorBody(deep);
  EXPECT_TRUE(absl::StrContains(d.status().message(), "deeply")) << d.status();

  std::string wide = "<ListBucketResult>";
  for (int i = 0; i < 200001; ++i) wide += "<x/>";
  wide += "</ListBucketResult>";
  auto w = ParseListBucketResult(wide);
  EXPECT_TRUE(absl::StrContains(w.status().message(), "too many")) << w.status();

  const std::string huge(kMaxXmlBytes + 1, ' ');
  EXPECT_EQ(ParseListBucketResult(huge).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(S3Xml, ErrorBody) {
  auto e = ParseErrorBody(R"(<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message><Key>a/b</Key>
<BucketName>bkt</BucketName><RequestId>4442587FB7D0A2F9</RequestId></Error>)");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->code, "NoSuchKey");
  EXPECT_EQ(e->message, "The specified key does not exist.");
  EXPECT_EQ(e->key, "a/b");
  EXPECT_EQ(e->bucket_name, "bkt");
  EXPECT_EQ(e->request_id, "4442587FB7D0A2F9");
  EXPECT_FALSE(ParseErrorBody("<ListBucketResult/>").ok());
}

TEST(S3Xml, MultipartResults) {
  auto id = ParseInitiateMultipartUploadResult(
      R"(<InitiateMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>b</Bucket><Key>k</Key>)"
      R"(<UploadId>VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA</UploadId></InitiateMultipartUploadResult>)");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, "VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA");
  EXPECT_FALSE(ParseInitiateMultipartUploadResult("<InitiateMultipartUploadResult/>").ok());

  auto done = ParseCompleteMultipartUploadResult(
      R"(<CompleteMultipartUploadResult><Location>http://b.s3/k</Location><Bucket>b</Bucket><Key>k</Key>)"
      R"(<ETag>"3858f62230ac3c915f300c664312c11f-9"</ETag></CompleteMultipartUploadResult>)");
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(done->is_error);
  EXPECT_EQ(done->etag, "3858f62230ac3c915f300c664312c11f-9");

  // 200 OK whose body is an error: S3 documents this for CompleteMultipartUpload.
  auto failed = ParseCompleteMultipartUploadResult(
      "<Error><Code>InternalError</Code><Message>We encountered an internal error.</Message></Error>");
  ASSERT_TRUE(failed.ok());
  EXPECT_TRUE(failed->is_error);
  EXPECT_EQ(failed->error.code, "InternalError");
}

TEST(S3Xml, EscapeAndEtag) {
  EXPECT_EQ(XmlEscape("<a&\"b'>"), "&lt;a&amp;&quot;b&apos;&gt;");
  EXPECT_EQ(StripEtagQuotes("\"abc\""), "abc");
  EXPECT_EQ(StripEtagQuotes("abc"), "abc");
  EXPECT_EQ(StripEtagQuotes("\""), "\"");
}

}  // namespace
}  // namespace recal::s3
