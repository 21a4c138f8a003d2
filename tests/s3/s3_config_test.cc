// S3 configuration (server/s3/s3_config.cc): endpoints, credentials and their precedence
// (secret directory > environment > shared credentials file), and s3:// locations,
// including hostile ones.
#include "server/s3/s3_config.h"

#include <sys/stat.h>

#include <map>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace recal::s3 {
namespace {

using recal::testing::TempDir;
using recal::testing::WriteBytes;

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(S3Config, Endpoints) {
  auto e = ParseEndpoint("http://127.0.0.1:9000");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->scheme, "http");
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 9000);
  EXPECT_EQ(e->HostHeader(), "127.0.0.1:9000");
  EXPECT_EQ(e->ToString(), "http://127.0.0.1:9000");
  auto aws = ParseEndpoint("https://S3.eu-west-1.amazonaws.com/");
  ASSERT_TRUE(aws.ok());
  EXPECT_EQ(aws->HostHeader(), "s3.eu-west-1.amazonaws.com");
  auto v6 = ParseEndpoint("http://[::1]:9000");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->HostHeader(), "[::1]:9000");
  EXPECT_EQ(ParseEndpoint("https://minio:443")->HostHeader(), "minio");
  for (const char* bad : {"127.0.0.1:9000", "ftp://h", "file:///etc/passwd", "http://", "http://h/path",
                          "http://user@h", "http://h?x=1", "http://h#f", "http://h:0", "http://h:70000",
                          "http://h:9x", "http://[::1", "http://h:", "http://h\r\nX: y"}) {
    EXPECT_EQ(ParseEndpoint(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(S3Config, RegionAddressingDefaults) {
  auto env = Env({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"}});
  auto aws = MakeS3Config({}, env);
  ASSERT_TRUE(aws.ok()) << aws.status();
  EXPECT_EQ(aws->region, "us-east-1");
  EXPECT_EQ(aws->endpoint.ToString(), "https://s3.us-east-1.amazonaws.com");
  EXPECT_EQ(aws->addressing, Addressing::kVirtualHost);

  S3Settings s;
  s.endpoint = "http://127.0.0.1:9000";
  auto minio = MakeS3Config(s, Env({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"},
                                    {"AWS_DEFAULT_REGION", "eu-west-3"}}));
  ASSERT_TRUE(minio.ok());
  EXPECT_EQ(minio->addressing, Addressing::kPath);
  EXPECT_EQ(minio->region, "eu-west-3");

  s.addressing = "virtual";
  s.region = "ap-south-1";
  auto v = MakeS3Config(s, Env({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"},
                                {"AWS_REGION", "eu-west-3"}}));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->addressing, Addressing::kVirtualHost);
  EXPECT_EQ(v->region, "ap-south-1");
  s.addressing = "sideways";
  EXPECT_FALSE(MakeS3Config(s, env).ok());
  s.addressing = "";
  s.region = "us/east";
  EXPECT_FALSE(MakeS3Config(s, env).ok());
}

class S3Credentials : public ::testing::Test {
 protected:
  void SetUp() override {
    ::mkdir(tmp_.File("secret").c_str(), 0700);
    WriteBytes(tmp_.File("secret/access_key_id"), "DIRKEY\n");
    WriteBytes(tmp_.File("secret/secret_access_key"), "dirsecret\n");
    ::mkdir(tmp_.File("home").c_str(), 0700);
    ::mkdir(tmp_.File("home/.aws").c_str(), 0700);
    WriteBytes(tmp_.File("home/.aws/credentials"),
               "# comment\n[default]\naws_access_key_id = FILEKEY\naws_secret_access_key=filesecret\r\n\n"
               "[other]\n; another comment\nAWS_ACCESS_KEY_ID = OTHERKEY\naws_secret_access_key = othersecret\n"
               "aws_session_token = othertoken\n");
  }
  TempDir tmp_;
};

TEST_F(S3Credentials, Precedence) {
  const std::map<std::string, std::string> env_keys = {
      {"AWS_ACCESS_KEY_ID", "ENVKEY"}, {"AWS_SECRET_ACCESS_KEY", "envsecret"}, {"AWS_SESSION_TOKEN", "envtoken"},
      {"HOME", tmp_.File("home")}};
  S3Settings with_dir;
  with_dir.credentials_dir = tmp_.File("secret");

  // 1. The secret directory wins over everything.
  auto c = LoadCredentials(with_dir, Env(env_keys));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id, "DIRKEY");
  EXPECT_EQ(c->secret_access_key, "dirsecret");  // the trailing newline trimmed
  EXPECT_EQ(c->session_token, "");

  // 2. Then the environment.
  c = LoadCredentials({}, Env(env_keys));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->access_key_id, "ENVKEY");
  EXPECT_EQ(c->session_token, "envtoken");

  // 3. Then the shared credentials file, [default] or the profile asked for.
  c = LoadCredentials({}, Env({{"HOME", tmp_.File("home")}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id, "FILEKEY");
  EXPECT_EQ(c->secret_access_key, "filesecret");
  c = LoadCredentials({}, Env({{"HOME", tmp_.File("home")}, {"AWS_PROFILE", "other"}}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->access_key_id, "OTHERKEY");
  EXPECT_EQ(c->session_token, "othertoken");
  S3Settings profile;
  profile.profile = "default";  // the setting beats $AWS_PROFILE
  c = LoadCredentials(profile, Env({{"HOME", tmp_.File("home")}, {"AWS_PROFILE", "other"}}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->access_key_id, "FILEKEY");

  // $AWS_SHARED_CREDENTIALS_FILE beats $HOME/.aws/credentials.
  WriteBytes(tmp_.File("creds.ini"), "[default]\naws_access_key_id=ALTKEY\naws_secret_access_key=alt\n");
  c = LoadCredentials({}, Env({{"HOME", tmp_.File("home")}, {"AWS_SHARED_CREDENTIALS_FILE", tmp_.File("creds.ini")}}));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->access_key_id, "ALTKEY");
}

TEST_F(S3Credentials, ErrorsSayWhatIsWrong) {
  // A secret directory that lacks a file is an error, not a fall-through to the environment.
  S3Settings dir;
  dir.credentials_dir = tmp_.File("home");
  auto c = LoadCredentials(dir, Env({{"AWS_ACCESS_KEY_ID", "K"}, {"AWS_SECRET_ACCESS_KEY", "S"}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "access_key_id")) << c.status();

  // Half the environment pair.
  c = LoadCredentials({}, Env({{"AWS_ACCESS_KEY_ID", "K"}, {"HOME", tmp_.File("home")}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);

  // A named profile that does not exist.
  c = LoadCredentials({}, Env({{"HOME", tmp_.File("home")}, {"AWS_PROFILE", "nope"}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "[nope]")) << c.status();

  // Nothing anywhere.
  c = LoadCredentials({}, Env({{"HOME", tmp_.File("nowhere")}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(c.status().message(), "nowhere/.aws/credentials")) << c.status();
  c = LoadCredentials({}, Env({}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);

  // Control characters (a header injection through a credential) are refused.
  c = LoadCredentials({}, Env({{"AWS_ACCESS_KEY_ID", "K\rX"}, {"AWS_SECRET_ACCESS_KEY", "S"}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);

  // A malformed shared credentials file.
  WriteBytes(tmp_.File("bad.ini"), "[default\naws_access_key_id=K\n");
  c = LoadCredentials({}, Env({{"AWS_SHARED_CREDENTIALS_FILE", tmp_.File("bad.ini")}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(S3Config, IniSections) {
  auto s = ReadIniSection("[a]\nk = v = w\n[ b ]\nx=1\n", "b");
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->size(), 1u);
  EXPECT_EQ((*s)[0], (std::pair<std::string, std::string>{"x", "1"}));
  EXPECT_EQ((*ReadIniSection("[a]\nk = v = w\n", "a"))[0].second, "v = w");
  EXPECT_EQ(ReadIniSection("[a]\njunk\n", "a").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadIniSection("", "a").status().code(), absl::StatusCode::kNotFound);
}

TEST(S3Config, Locations) {
  auto l = ParseS3Url("s3://my-bucket");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->bucket, "my-bucket");
  EXPECT_EQ(l->prefix, "");
  l = ParseS3Url("s3://my.bucket-1/models//v1/./x/");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->prefix, "models/v1/x/");
  EXPECT_EQ(l->ToString(), "s3://my.bucket-1/models/v1/x/");
  EXPECT_EQ(ParseS3Url("s3://bkt/a")->prefix, "a/");
  EXPECT_EQ(ParseS3Url("s3://bkt/")->prefix, "");
  EXPECT_EQ(ParseS3Url("s3://bkt/a b/é")->prefix, "a b/é/");
}

TEST(S3Config, HostileLocations) {
  for (const char* bad : {
           "s3://", "s3:///prefix", "S3://bkt", "http://bkt/x", "bkt/x", "s3:/bkt",
           "s3://bkt/../other", "s3://bkt/a/../../b", "s3://bkt/..", "s3://bkt/a/..",
           "s3://bkt/x?y=1", "s3://bkt/x#frag", "s3://bkt/a\\b", "s3://bkt/a\nb", "s3://bkt/\x7f",
           "s3://Bucket/x", "s3://b_k_t/x", "s3://ab/x", "s3://-bkt/x", "s3://bkt-/x", "s3://b..kt/x",
           "s3://192.168.1.1/x", "s3://xn--bkt/x", "s3://bkt-s3alias/x", "s3://user@bkt/x", "s3://bkt:9000/x",
           "s3://127.0.0.1:9000/x",
       }) {
    auto l = ParseS3Url(bad);
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << absl::CEscape(bad);
    EXPECT_FALSE(l.status().message().empty());
  }
  EXPECT_EQ(ParseS3Url(std::string("s3://bkt/a\0b", 12)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseS3Url(absl::StrCat("s3://bkt/", std::string(901, 'a'))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseS3Url(absl::StrCat("s3://", std::string(64, 'a'))).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ParseS3Url(absl::StrCat("s3://", std::string(63, 'a'))).ok());
}

TEST(S3Config, ObjectKeys) {
  EXPECT_TRUE(ValidateObjectKey("a/b c/é.npy").ok());
  EXPECT_FALSE(ValidateObjectKey("").ok());
  EXPECT_FALSE(ValidateObjectKey(std::string(1025, 'k')).ok());
  EXPECT_FALSE(ValidateObjectKey("a\r\nb").ok());
  EXPECT_FALSE(ValidateObjectKey(std::string("a\0b", 3)).ok());
}

}  // namespace
}  // namespace recal::s3
