// The auth file: what parses, what each line gives, and every malformed line refused with
// its line number and why.
#include "server/auth/auth_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace recal::auth {
namespace {

using ::testing::HasSubstr;

const std::string kHash(64, 'a');

TEST(AuthFile, CredentialsRolesTenantsAndQuotas) {
  auto config = ParseAuthFile(
      "# team vision\n"
      "token-sha256:" + kHash + " tenant=vision role=submit max_active_jobs=5\n"
      "\n"
      "cert:\"CN=trainer a,O=Example\" tenant=vision role=read   # a subject with a blank\n"
      "cert:trainer-b.example tenant=speech role=admin\n"
      "tenant vision max_stored_bytes=1000 max_submissions_per_minute=60 max_concurrent_inspections=1\n"
      "tenant speech max_running_jobs=3\n"
      "tenant idle\n");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->tokens.count(kHash), 1u);
  const Principal& token = config->tokens.at(kHash);
  EXPECT_EQ(token.tenant, "vision");
  EXPECT_EQ(token.role, Role::kSubmit);
  EXPECT_EQ(token.name, "token:aaaaaaaaaaaa");  // a prefix of the hash, never more
  EXPECT_EQ(config->certs.at("CN=trainer a,O=Example").role, Role::kRead);
  EXPECT_EQ(config->certs.at("trainer-b.example").tenant, "speech");
  const TenantQuotas vision = config->quotas.at("vision");
  EXPECT_EQ(vision.max_active_jobs, 5);
  EXPECT_EQ(vision.max_stored_bytes, 1000);
  EXPECT_EQ(vision.max_submissions_per_minute, 60);
  EXPECT_EQ(vision.max_concurrent_inspections, 1);
  EXPECT_EQ(vision.max_running_jobs, 0);  // the server's default (--tenant_max_running_jobs)
  EXPECT_EQ(config->quotas.at("speech").max_running_jobs, 3);
  EXPECT_EQ(config->quotas.at("speech").max_active_jobs, 0);
  EXPECT_EQ(config->tenants, (std::set<std::string>{"idle", "speech", "vision"}));
}

TEST(AuthFile, EveryMalformedLineIsRefusedWithItsNumberAndWhy) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"token-sha256:abc tenant=t role=read", "64 lowercase hex"},
      {"token-sha256:" + std::string(64, 'A') + " tenant=t role=read", "64 lowercase hex"},
      {"token-sha256:" + kHash + " tenant=t", "tenant=<name> and role=<role>"},
      {"token-sha256:" + kHash + " role=read", "tenant=<name> and role=<role>"},
      {"token-sha256:" + kHash + " tenant=t role=root", "role 'root'"},
      {"token-sha256:" + kHash + " tenant=../x role=read", "is not a name"},
      {"token-sha256:" + kHash + " tenant=.. role=read", "is not a name"},
      {"token-sha256:" + kHash + " tenant=" + std::string(65, 'a') + " role=read", "is not a name"},
      {"token-sha256:" + kHash + " tenant=t role=read colour=blue", "unknown key 'colour'"},
      {"token-sha256:" + kHash + " tenant=t role=read max_active_jobs=-1", "whole number"},
      {"token-sha256:" + kHash + " tenant=t role=read max_active_jobs=lots", "whole number"},
      {"cert: tenant=t role=read", "subject or a SAN"},
      {"cert:\"CN=open tenant=t role=read", "quote is not closed"},
      {"user alice tenant=t role=read", "is not token-sha256"},
      {"tenant", "needs a name"},
      {"tenant t max_active_jobs=1\ntenant t max_active_jobs=2", "cannot also be 2"},
      {"tenant t max_running_jobs=-2", "whole number"},
      {"tenant t max_running_jobs=1\ntoken-sha256:" + kHash + " tenant=t role=read max_running_jobs=4",
       "max_running_jobs=1 already; it cannot also be 4"},
      {"tenant t max_running_job=1", "max_running_jobs"},  // a misspelt key: the message lists the right one
      {"token-sha256:" + kHash + " tenant=t role=read\ntoken-sha256:" + kHash + " tenant=u role=admin",
       "listed twice"},
  };
  for (const auto& [text, why] : cases) {
    auto config = ParseAuthFile("# header\n" + text + "\n");
    ASSERT_FALSE(config.ok()) << text;
    EXPECT_TRUE(absl::IsInvalidArgument(config.status())) << text;
    EXPECT_THAT(config.status().message(), HasSubstr("line ")) << text;
    EXPECT_THAT(config.status().message(), HasSubstr(why)) << text;
  }
  EXPECT_THAT(ParseAuthFile("# 1\n# 2\nbogus\n").status().message(), HasSubstr("line 3"));
}

TEST(AuthFile, TheSameQuotaRepeatedWithTheSameValueIsFine) {
  auto config = ParseAuthFile("tenant t max_active_jobs=1\ntoken-sha256:" + kHash +
                              " tenant=t role=read max_active_jobs=1\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->quotas.at("t").max_active_jobs, 1);
  EXPECT_TRUE(ParseAuthFile("").ok());
}

// Retention settings stand beside the quotas: absent is the server's default (distinct from
// 0, which keeps everything for the tenant); a second, different value is refused.
TEST(AuthFile, RetentionSettingsAreTheTenantsOrTheServersDefault) {
  auto config = ParseAuthFile("tenant vision keep_versions=3 keep_results_days=0\ntenant speech\n");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->quotas.at("vision").keep_versions, 3);
  EXPECT_EQ(config->quotas.at("vision").keep_results_days, 0);
  EXPECT_EQ(config->quotas.at("speech").keep_versions, kRetentionDefault);
  EXPECT_EQ(config->quotas.at("speech").keep_results_days, kRetentionDefault);
  absl::StatusOr<AuthConfig> twice = ParseAuthFile("tenant t keep_versions=1\ntenant t keep_versions=2\n");
  EXPECT_TRUE(absl::IsInvalidArgument(twice.status()));
  EXPECT_NE(twice.status().message().find("keep_versions=1 already"), absl::string_view::npos) << twice.status();
  EXPECT_TRUE(absl::IsInvalidArgument(ParseAuthFile("tenant t keep_results_days=-1\n").status()));
}

}  // namespace
}  // namespace recal::auth
