// The authenticator: a token found by its hash, certificate names, what each refusal says,
// roles, reloads that keep the old file when the new one is broken, and the open mode.
#include "server/auth/authenticator.h"

#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/sha256.h"
#include "tests/test_util.h"

namespace recal::auth {
namespace {

using ::testing::HasSubstr;

std::string Line(const std::string& token, const std::string& tenant, const std::string& role) {
  return "token-sha256:" + Sha256Hex(token) + " tenant=" + tenant + " role=" + role + "\n";
}

TEST(Authenticator, TokensAndCertificatesNameTheirPrincipal) {
  testing::TempDir tmp;
  const std::string path = tmp.File("auth.txt");
  std::ofstream(path) << Line("secret-a", "a", "submit") << "cert:trainer.example tenant=b role=read\n";
  auto auth = Authenticator::FromFile(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  auto a = (*auth)->Authenticate("Bearer secret-a", {});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->tenant, "a");
  EXPECT_EQ(a->role, Role::kSubmit);
  EXPECT_THAT(a->name, HasSubstr(Sha256Hex("secret-a").substr(0, 12)));
  auto b = (*auth)->Authenticate(std::nullopt, {"CN=trainer", "trainer.example"});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->tenant, "b");

  // A token decides alone: a wrong one is not rescued by a good certificate.
  EXPECT_TRUE(absl::IsUnauthenticated((*auth)->Authenticate("Bearer nope", {"trainer.example"}).status()));
  EXPECT_TRUE(absl::IsUnauthenticated((*auth)->Authenticate("Basic c2VjcmV0LWE=", {}).status()));
  EXPECT_TRUE(absl::IsUnauthenticated((*auth)->Authenticate("Bearer ", {}).status()));
  EXPECT_TRUE(absl::IsUnauthenticated((*auth)->Authenticate("secret-a", {}).status()));
  // The hash itself is not a token.
  EXPECT_TRUE(absl::IsUnauthenticated((*auth)->Authenticate("Bearer " + Sha256Hex("secret-a"), {}).status()));
  auto none = (*auth)->Authenticate(std::nullopt, {});
  EXPECT_TRUE(absl::IsUnauthenticated(none.status()));
  EXPECT_THAT(none.status().message(), HasSubstr("Bearer"));
  auto stranger = (*auth)->Authenticate(std::nullopt, {"CN=stranger"});
  EXPECT_THAT(stranger.status().message(), HasSubstr("not in the auth file"));
}

TEST(Authenticator, ReloadSwapsTheFileAndKeepsTheOldOneWhenTheNewOneIsBroken) {
  testing::TempDir tmp;
  const std::string path = tmp.File("auth.txt");
  std::ofstream(path) << Line("old", "a", "read") << "tenant a max_active_jobs=2\n";
  auto auth = *Authenticator::FromFile(path);
  std::ofstream(path) << "token-sha256:broken tenant=a role=read\n";
  const absl::Status broken = auth->Reload();
  EXPECT_TRUE(absl::IsInvalidArgument(broken));
  EXPECT_THAT(broken.message(), HasSubstr("line 1"));
  EXPECT_TRUE(auth->Authenticate("Bearer old", {}).ok());
  EXPECT_EQ(auth->QuotasOf("a").max_active_jobs, 2);

  std::ofstream(path) << Line("new", "a", "admin") << "tenant a max_active_jobs=7\n";
  ASSERT_TRUE(auth->Reload().ok());
  EXPECT_TRUE(absl::IsUnauthenticated(auth->Authenticate("Bearer old", {}).status()));
  EXPECT_EQ(auth->Authenticate("Bearer new", {})->role, Role::kAdmin);
  EXPECT_EQ(auth->QuotasOf("a").max_active_jobs, 7);
  EXPECT_EQ(auth->QuotasOf("nobody").max_active_jobs, 0);

  EXPECT_TRUE(absl::IsNotFound(Authenticator::FromFile(tmp.File("missing")).status()));
}

TEST(Authenticator, RolesAreOrderedAndTheRefusalSaysWhatWasNeeded) {
  const Principal reader{"a", Role::kRead, "token:x"};
  EXPECT_TRUE(Authorize(reader, Role::kRead, "GetJob").ok());
  const absl::Status refused = Authorize(reader, Role::kSubmit, "SubmitJob");
  EXPECT_TRUE(absl::IsPermissionDenied(refused));
  EXPECT_THAT(refused.message(), HasSubstr("role read may not SubmitJob (needs submit)"));
  EXPECT_TRUE(Authorize({"a", Role::kAdmin, "x"}, Role::kSubmit, "SubmitJob").ok());
  EXPECT_FALSE(Authorize({"a", Role::kSubmit, "x"}, Role::kAdmin, "DeleteModel").ok());
}

TEST(Authenticator, TheOpenModeAdmitsEveryoneAsAdminOfTheDefaultTenant) {
  auto open = Authenticator::Open("default");
  EXPECT_FALSE(open->enabled());
  auto anyone = open->Authenticate(std::nullopt, {});
  ASSERT_TRUE(anyone.ok());
  EXPECT_EQ(anyone->tenant, "default");
  EXPECT_EQ(anyone->role, Role::kAdmin);
  EXPECT_TRUE(open->Reload().ok());
}

}  // namespace
}  // namespace recal::auth
