// The SigV4 signer (server/s3/sigv4.cc) against AWS's published signatures.
//
// Generic vectors: AWS's SigV4 test suite ("aws-sig-v4-test-suite", 2015 edition:
// AKIDEXAMPLE, 20150830T123600Z, us-east-1, service "service"), as kept in
// github.com/awslabs/aws-c-auth, tests/aws-signing-test-suite/v4/<case>/ (request.txt,
// header-canonical-request.txt, header-signature.txt). Only cases whose path needs no
// normalisation are used: S3 never normalises paths, so the signer does not either.
//
// S3 vectors: the four examples of "Signature Calculations for the Authorization Header:
// Transferring Payload in a Single Chunk" in the Amazon S3 API Reference
// (docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html):
// AKIAIOSFODNN7EXAMPLE, examplebucket, 20130524T000000Z, us-east-1.
#include "server/s3/sigv4.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "common/sha256.h"
#include "gtest/gtest.h"

namespace recal::s3 {
namespace {

struct Vector {
  const char* name;
  const char* method;
  const char* path;
  HeaderList query;
  HeaderList headers;
  const char* body;
  bool content_sha256_header;
  const char* session_token;
  const char* signature;
};

absl::Time At(const char* rfc3339) {
  absl::Time t;
  std::string err;
  EXPECT_TRUE(absl::ParseTime(absl::RFC3339_full, rfc3339, &t, &err)) << err;
  return t;
}

SignedRequest SignSuite(const Vector& v) {
  SigningRequest r;
  r.method = v.method;
  r.path = v.path;
  r.query = v.query;
  r.headers = v.headers;
  r.payload_hash = Sha256Hex(v.body);
  r.add_content_sha256_header = v.content_sha256_header;
  SigningParams p{{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", v.session_token}, "us-east-1",
                  "service", At("2015-08-30T12:36:00Z")};
  auto s = SignV4(r, p);
  EXPECT_TRUE(s.ok()) << v.name << ": " << s.status();
  return s.ok() ? *s : SignedRequest{};
}

const char kHost[] = "example.amazonaws.com";
const char kStsToken[] =
    "AQoDYXdzEPT//////////wEXAMPLEtc764bNrC9SAPBSM22wDOk4x4HIZ8j4FZTwdQWLWsKWHGBuFqwAeMicRXmxfpSPfIeoIYRqTflfKD8YUu"
    "wthAx7mSEI/qkPpKPi/kMcGdQrmGdeehM4IC1NtBmUpp2wUE8phUZampKsburEDy0KPkyQDYwT7WZ0wq5VSXDvp75YU9HFvlRd8Tx6q6fE8YQ"
    "cHNVXAkiY9q6d+xo0rKwT38xVqr7ZD0u0iPPkUL64lIZbqBAz+scqKmlzm8FDrypNC9Yjc8fPOLn9FX9KSYvKTr4rvx3iSIlTJabIQwj2ICCR/o"
    "LxBA==";

const Vector kSuite[] = {
    {"get-vanilla", "GET", "/", {}, {{"Host", kHost}}, "", false, "",
     "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"},
    {"get-vanilla-query-order-key-case", "GET", "/", {{"Param2", "value2"}, {"Param1", "value1"}}, {{"Host", kHost}},
     "", false, "", "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"},
    {"get-vanilla-query-unreserved", "GET", "/",
     {{"-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
       "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"}},
     {{"Host", kHost}}, "", false, "", "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197"},
    {"get-vanilla-utf8-query", "GET", "/", {{"\xE1\x88\xB4", "bar"}}, {{"Host", kHost}}, "", false, "",
     "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04"},
    {"get-header-value-trim", "GET", "/", {},
     {{"Host", kHost}, {"My-Header1", " value1"}, {"My-Header2", " \"a   b   c\""}}, "", false, "",
     "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736"},
    {"get-header-key-duplicate", "GET", "/", {},
     {{"Host", kHost}, {"My-Header1", "value2"}, {"My-Header1", "value2"}, {"My-Header1", "value1"}}, "", false, "",
     "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea"},
    {"get-header-value-order", "GET", "/", {},
     {{"Host", kHost}, {"My-Header1", "value4"}, {"My-Header1", "value1"}, {"My-Header1", "value3"},
      {"My-Header1", "value2"}},
     "", false, "", "08c7e5a9acfcfeb3ab6b2185e75ce8b1deb5e634ec47601a50643f830c755c01"},
    {"get-unreserved", "GET", "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", {},
     {{"Host", kHost}}, "", false, "", "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f"},
    {"get-utf8", "GET", "/\xE1\x88\xB4", {}, {{"Host", kHost}}, "", false, "",
     "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85"},
    {"get-space-unnormalized", "GET", "/example space/", {}, {{"Host", kHost}}, "", false, "",
     "652487583200325589f1fba4c7e578f72c47cb61beeca81406b39ddec1366741"},
    {"post-vanilla-query", "POST", "/", {{"Param1", "value1"}}, {{"Host", kHost}}, "", false, "",
     "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11"},
    {"post-header-key-sort", "POST", "/", {}, {{"Host", kHost}, {"My-Header1", "value1"}}, "", false, "",
     "c5410059b04c1ee005303aed430f6e6645f61f4dc9e1461ec8f8916fdf18852c"},
    {"post-header-value-case", "POST", "/", {}, {{"Host", kHost}, {"My-Header1", "VALUE1"}}, "", false, "",
     "cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d"},
    // sign_body: true in these two: x-amz-content-sha256 is sent and signed, as S3 wants.
    {"post-x-www-form-urlencoded", "POST", "/", {},
     {{"Content-Type", "application/x-www-form-urlencoded"}, {"Host", kHost}, {"Content-Length", "13"}},
     "Param1=value1", true, "", "d3875051da38690788ef43de4db0d8f280229d82040bfac253562e56c3f20e0b"},
    {"post-x-www-form-urlencoded-parameters", "POST", "/", {},
     {{"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"}, {"Host", kHost}, {"Content-Length", "13"}},
     "Param1=value1", true, "", "328d1b9eaadca9f5818ef05e8392801e091653bafec24fcab71e7344e7f51422"},
    {"get-vanilla-with-session-token", "GET", "/", {}, {{"Host", kHost}}, "", false,
     "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267",
     "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8"},
    {"post-sts-header-before", "POST", "/", {}, {{"Host", kHost}}, "", false, kStsToken,
     "85d96828115b5dc0cfc3bd16ad9e210dd772bbebba041836c64533a82be05ead"},
};

TEST(S3SigV4, AwsTestSuiteSignatures) {
  for (const Vector& v : kSuite) {
    SignedRequest s = SignSuite(v);
    EXPECT_EQ(s.signature, v.signature) << v.name << "\ncanonical request:\n" << s.canonical_request;
  }
}

TEST(S3SigV4, AwsTestSuiteGetVanillaIntermediates) {
  SignedRequest s = SignSuite(kSuite[0]);
  // header-canonical-request.txt, header-string-to-sign.txt, header-signed-request.txt
  EXPECT_EQ(s.canonical_request,
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
            "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63");
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
            "SignedHeaders=host;x-amz-date, "
            "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
  ASSERT_EQ(s.headers_to_add.size(), 2u);  // no x-amz-content-sha256 for a non-S3 service
  EXPECT_EQ(s.headers_to_add[0], (std::pair<std::string, std::string>{"x-amz-date", "20150830T123600Z"}));
}

TEST(S3SigV4, AwsTestSuiteQueryAndPathEncoding) {
  EXPECT_EQ(SignSuite(kSuite[1]).encoded_query, "Param1=value1&Param2=value2");
  EXPECT_EQ(SignSuite(kSuite[3]).encoded_query, "%E1%88%B4=bar");
  EXPECT_EQ(SignSuite(kSuite[8]).encoded_path, "/%E1%88%B4");
  EXPECT_EQ(SignSuite(kSuite[9]).encoded_path, "/example%20space/");
  EXPECT_TRUE(absl::StrContains(SignSuite(kSuite[4]).canonical_request, "my-header2:\"a b c\"\n"));
  EXPECT_TRUE(absl::StrContains(SignSuite(kSuite[5]).canonical_request, "my-header1:value2,value2,value1\n"));
  EXPECT_TRUE(absl::StrContains(SignSuite(kSuite[15]).canonical_request,
                                "x-amz-security-token:6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267\n"));
}

// The S3 API Reference's examples.
SignedRequest SignS3(const char* method, const char* path, HeaderList query, HeaderList headers,
                     const std::string& payload_hash) {
  SigningRequest r;
  r.method = method;
  r.path = path;
  r.query = std::move(query);
  r.headers = std::move(headers);
  r.payload_hash = payload_hash;
  SigningParams p{{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""}, "us-east-1", "s3",
                  At("2013-05-24T00:00:00Z")};
  auto s = SignV4(r, p);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : SignedRequest{};
}

const char kEmptyHash[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
const char kS3Host[] = "examplebucket.s3.amazonaws.com";

TEST(S3SigV4, S3ExampleGetObjectRange) {
  SignedRequest s = SignS3("GET", "/test.txt", {}, {{"Host", kS3Host}, {"Range", "bytes=0-9"}}, kEmptyHash);
  EXPECT_EQ(s.canonical_request,
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
            "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(s.signature, "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(S3SigV4, S3ExamplePutObject) {
  const std::string hash = Sha256Hex("Welcome to Amazon S3.");
  ASSERT_EQ(hash, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  SignedRequest s = SignS3("PUT", "/test$file.text", {},
                           {{"Host", kS3Host},
                            {"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                            {"x-amz-storage-class", "REDUCED_REDUNDANCY"}},
                           hash);
  EXPECT_EQ(s.encoded_path, "/test%24file.text");
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d");
  EXPECT_EQ(s.signature, "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(S3SigV4, S3ExampleGetBucketLifecycle) {
  SignedRequest s = SignS3("GET", "/", {{"lifecycle", ""}}, {{"Host", kS3Host}}, kEmptyHash);
  EXPECT_EQ(s.encoded_query, "lifecycle=");
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca");
  EXPECT_EQ(s.signature, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(S3SigV4, S3ExampleListObjects) {
  SignedRequest s = SignS3("GET", "/", {{"prefix", "J"}, {"max-keys", "2"}}, {{"Host", kS3Host}}, kEmptyHash);
  EXPECT_EQ(s.encoded_query, "max-keys=2&prefix=J");
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7");
  EXPECT_EQ(s.signature, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
  EXPECT_EQ(s.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
            "Signature=34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(S3SigV4, S3KeysKeepSlashesAndEncodeEverythingElse) {
  SignedRequest s = SignS3("GET", "/bucket/a b/c+d/./e//f%?#=&\xC3\xA9", {{"continuation-token", "a/b+c="}},
                           {{"Host", "h"}}, std::string(kUnsignedPayload));
  EXPECT_EQ(s.encoded_path, "/bucket/a%20b/c%2Bd/./e//f%25%3F%23%3D%26%C3%A9");
  EXPECT_EQ(s.encoded_query, "continuation-token=a%2Fb%2Bc%3D");
  EXPECT_TRUE(absl::EndsWith(s.canonical_request, "\nUNSIGNED-PAYLOAD"));
}

TEST(S3SigV4, RefusesWhatWouldBreakTheRequest) {
  SigningRequest ok;
  ok.method = "GET";
  ok.headers = {{"Host", "h"}};
  ok.payload_hash = kEmptyHash;
  SigningParams p{{"AKID", "secret", ""}, "us-east-1", "s3", absl::UnixEpoch()};
  ASSERT_TRUE(SignV4(ok, p).ok());

  auto refused = [&](SigningRequest r, SigningParams pp, const char* why) {
    auto s = SignV4(r, pp);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << why;
  };
  SigningRequest r = ok;
  r.headers = {};
  refused(r, p, "no Host");
  r = ok;
  r.headers.emplace_back("X-Evil", "a\r\nAuthorization: x");
  refused(r, p, "CRLF in a value");
  r = ok;
  r.headers.emplace_back("Bad Name", "v");
  refused(r, p, "space in a name");
  r = ok;
  r.headers.emplace_back("Authorization", "v");
  refused(r, p, "the signer's header");
  r = ok;
  r.payload_hash = "abc";
  refused(r, p, "bad payload hash");
  r = ok;
  r.path = "relative";
  refused(r, p, "relative path");
  SigningParams q = p;
  q.credentials.secret_access_key = "";
  refused(ok, q, "no secret");
  q = p;
  q.credentials.access_key_id = "AK/ID";
  refused(ok, q, "'/' in the key id");
  q = p;
  q.region = "us/east";
  refused(ok, q, "'/' in the region");
  q = p;
  q.credentials.session_token = "tok\nen";
  refused(ok, q, "LF in the token");
}

TEST(S3SigV4, UriEncodeAndDate) {
  EXPECT_EQ(UriEncode("aZ09-_.~ /", false), "aZ09-_.~%20%2F");
  EXPECT_EQ(UriEncode("a/b", true), "a/b");
  EXPECT_EQ(UriEncode(std::string("\0\xff", 2), true), "%00%FF");
  EXPECT_EQ(AmzDate(At("2015-08-30T12:36:00Z")), "20150830T123600Z");
}

}  // namespace
}  // namespace recal::s3
