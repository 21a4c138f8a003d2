// Model references and names: every form parses to what it names, and everything else is
// refused saying which forms there are.
#include "server/jobs/model_ref.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace recal::jobs {
namespace {

using ::testing::HasSubstr;

const std::string kHex = "8b129e" + std::string(58, 'a');

TEST(ModelRefTest, DigestsAndPrefixesWithOrWithoutTheSchemeAreLowercased) {
  for (const std::string& text : {"sha256:" + kHex, kHex, "SHA256:" + kHex}) {
    absl::StatusOr<ModelRef> ref = ParseModelRef(text);
    if (text.rfind("SHA", 0) == 0) {  // the scheme is lowercase; "SHA256:..." is a bad name
      EXPECT_TRUE(absl::IsInvalidArgument(ref.status())) << text;
      continue;
    }
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ(ref->kind, ModelRef::Kind::kId) << text;
    EXPECT_EQ(ref->digest, kHex);
  }
  for (const std::string& text :
       {std::string("sha256:8b129e"), std::string("8b129e"), std::string("8B129E"), "sha256:" + kHex.substr(0, 63)}) {
    absl::StatusOr<ModelRef> ref = ParseModelRef(text);
    ASSERT_TRUE(ref.ok()) << text << ": " << ref.status();
    EXPECT_EQ(ref->kind, ModelRef::Kind::kPrefix) << text;
    EXPECT_EQ(ref->digest, kHex.substr(0, ref->digest.size())) << text;
    EXPECT_GE(ref->digest.size(), 6u);
  }
}

TEST(ModelRefTest, NamesAndVersions) {
  absl::StatusOr<ModelRef> latest = ParseModelRef("rn50");
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->kind, ModelRef::Kind::kName);
  EXPECT_EQ(latest->name, "rn50");
  EXPECT_EQ(latest->version, 0);
  absl::StatusOr<ModelRef> second = ParseModelRef("ResNet.pt:12");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->name, "ResNet.pt");
  EXPECT_EQ(second->version, 12);
  // Short hex is a name: fewer than 6 digits are no prefix.
  EXPECT_EQ(ParseModelRef("abc")->kind, ModelRef::Kind::kName);
  EXPECT_EQ(ParseModelRef("cafe:2")->version, 2);
}

TEST(ModelRefTest, EverythingElseIsInvalidArgumentNamingTheForms) {
  for (const std::string& text :
       {std::string(""), std::string("sha256:"), std::string("sha256:8b129"), std::string("sha256:xyz123"),
        "sha256:" + kHex + "0", kHex + "0", std::string("rn50:"), std::string("rn50:0"), std::string("rn50:-1"),
        std::string("rn50:v2"), std::string("rn50:1:2"), std::string(":3"), std::string("a/b"),
        std::string("deadbeef:2"), std::string("rn50:99999999999999999999"), std::string(" rn50")}) {
    absl::StatusOr<ModelRef> ref = ParseModelRef(text);
    ASSERT_TRUE(absl::IsInvalidArgument(ref.status())) << "'" << text << "': " << ref.status();
    EXPECT_THAT(ref.status().message(), HasSubstr("NAME:VERSION")) << text;
  }
}

TEST(ModelRefTest, NamesThatCouldNotBeReadBackAreRefused) {
  for (const std::string& name :
       std::vector<std::string>{"rn50", "ResNet.pt", "my model.pt", "abcde", "Décade", "x:", "a/b", "", " x", "x ",
                                "sha256", "deadbeef", "DEADBEEF", std::string(129, 'x'), std::string("a\tb")}) {
    const absl::Status status = CheckModelName(name);
    const bool good =
        name == "rn50" || name == "ResNet.pt" || name == "my model.pt" || name == "abcde" || name == "Décade";
    EXPECT_EQ(status.ok(), good) << "'" << name << "': " << status;
    if (!good) {
      EXPECT_TRUE(absl::IsInvalidArgument(status)) << name;
      // Every name an upload may use reads back as itself.
    } else {
      absl::StatusOr<ModelRef> ref = ParseModelRef(name);
      ASSERT_TRUE(ref.ok()) << name << ": " << ref.status();
      EXPECT_EQ(ref->kind, ModelRef::Kind::kName);
      EXPECT_EQ(ref->name, name);
    }
  }
  EXPECT_THAT(CheckModelName("deadbeef").message(), HasSubstr("digest prefix"));
}

}  // namespace
}  // namespace recal::jobs
