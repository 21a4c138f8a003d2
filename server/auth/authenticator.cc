#include "server/auth/authenticator.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/sha256.h"

namespace recal::auth {
namespace {

absl::StatusOr<std::shared_ptr<const AuthConfig>> Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the auth file ", path));
  std::stringstream text;
  text << in.rdbuf();
  auto config = ParseAuthFile(text.str());
  if (!config.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", config.status().message()));
  return std::make_shared<const AuthConfig>(*std::move(config));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::FromFile(const std::string& path) {
  auto config = Load(path);
  if (!config.ok()) return config.status();
  return std::unique_ptr<Authenticator>(new Authenticator(path, *std::move(config), ""));
}

std::unique_ptr<Authenticator> Authenticator::Open(const std::string& default_tenant) {
  return std::unique_ptr<Authenticator>(new Authenticator("", std::make_shared<const AuthConfig>(), default_tenant));
}

std::shared_ptr<const AuthConfig> Authenticator::config() const {
  std::lock_guard<std::mutex> lock(mu_);
  return config_;
}

absl::Status Authenticator::Reload() {
  if (!enabled()) return absl::OkStatus();
  auto config = Load(path_);
  if (!config.ok()) return config.status();
  std::lock_guard<std::mutex> lock(mu_);
  config_ = *std::move(config);
  return absl::OkStatus();
}

absl::StatusOr<Principal> Authenticator::Authenticate(const std::optional<std::string>& authorization,
                                                      const std::vector<std::string>& certificate_names) const {
  if (!enabled()) return Principal{open_tenant_, Role::kAdmin, "open"};
  const std::shared_ptr<const AuthConfig> now = config();
  if (authorization.has_value()) {
    absl::string_view token = *authorization;
    if (!absl::ConsumePrefix(&token, "Bearer ") || absl::StripAsciiWhitespace(token).empty()) {
      return absl::UnauthenticatedError("the authorization metadata is not 'Bearer <token>'");
    }
    // Looked up by its hash: the server holds no token, and the lookup's timing can say
    // something about a hash only, not about a token.
    auto found = now->tokens.find(Sha256Hex(absl::StripAsciiWhitespace(token)));
    if (found == now->tokens.end()) return absl::UnauthenticatedError("unknown token");
    return found->second;
  }
  for (const std::string& name : certificate_names) {
    auto found = now->certs.find(name);
    if (found != now->certs.end()) return found->second;
  }
  if (!certificate_names.empty()) {
    return absl::UnauthenticatedError(absl::StrCat("the client certificate '", certificate_names.front(),
                                                   "' is not in the auth file"));
  }
  return absl::UnauthenticatedError(
      "no credential: send 'authorization: Bearer <token>' (recalctl --token, RECAL_TOKEN) or a client certificate");
}

TenantQuotas Authenticator::QuotasOf(const std::string& tenant) const {
  const std::shared_ptr<const AuthConfig> now = config();
  auto found = now->quotas.find(tenant);
  return found == now->quotas.end() ? TenantQuotas() : found->second;
}

std::vector<std::string> Authenticator::Tenants() const {
  const std::shared_ptr<const AuthConfig> now = config();
  if (!enabled()) return {open_tenant_};
  return std::vector<std::string>(now->tenants.begin(), now->tenants.end());
}

absl::Status Authorize(const Principal& principal, Role needed, absl::string_view action) {
  if (static_cast<int>(principal.role) >= static_cast<int>(needed)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("role ", RoleName(principal.role), " may not ", action, " (needs ",
                                                  RoleName(needed), ")"));
}

}  // namespace recal::auth
