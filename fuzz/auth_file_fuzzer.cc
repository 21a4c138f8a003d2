// The auth file (--auth_file; server/auth/auth_file.cc), and what the server does with one
// (server/auth/authenticator.cc: loaded from disk, then every call's "authorization"
// metadata and certificate names looked up in it). The input is the file's text; it is also
// tried as a call's authorization value and certificate name.
//
// Contract: a bad file is INVALID_ARGUMENT naming the line; a file that parses has valid
// tenant names, 64-hex token hashes, non-negative quotas and every tenant listed; written
// back out it parses to the same config; every credential in it authenticates as itself,
// and unknown credentials are UNAUTHENTICATED with a message.
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tenant_name.h"
#include "fuzz/fuzz_util.h"
#include "server/auth/auth_file.h"
#include "server/auth/authenticator.h"

namespace {

using recal::auth::AuthConfig;
using recal::auth::Principal;
using recal::auth::TenantQuotas;

bool Same(const Principal& a, const Principal& b) {
  return a.tenant == b.tenant && a.role == b.role && a.name == b.name;
}

bool Same(const TenantQuotas& a, const TenantQuotas& b) {
  return a.max_active_jobs == b.max_active_jobs && a.max_stored_bytes == b.max_stored_bytes &&
         a.max_submissions_per_minute == b.max_submissions_per_minute;
}

template <typename Map, typename Eq>
bool SameMaps(const Map& a, const Map& b, Eq eq) {
  if (a.size() != b.size()) return false;
  for (auto i = a.begin(), j = b.begin(); i != a.end(); ++i, ++j) {
    if (i->first != j->first || !eq(i->second, j->second)) return false;
  }
  return true;
}

// The config as an auth file: one line per credential, one per tenant with its quotas.
std::string Render(const AuthConfig& config) {
  std::string out = "# written back by auth_file_fuzzer\n";
  for (const auto& [hash, p] : config.tokens) {
    absl::StrAppend(&out, "token-sha256:", hash, " tenant=", p.tenant, " role=", recal::auth::RoleName(p.role), "\n");
  }
  for (const auto& [name, p] : config.certs) {
    absl::StrAppend(&out, "\"cert:", name, "\" tenant=", p.tenant, " role=", recal::auth::RoleName(p.role), "\n");
  }
  for (const std::string& tenant : config.tenants) {
    const auto q = config.quotas.find(tenant);
    const TenantQuotas quotas = q == config.quotas.end() ? TenantQuotas() : q->second;
    absl::StrAppend(&out, "tenant ", tenant, " max_active_jobs=", quotas.max_active_jobs,
                    " max_stored_bytes=", quotas.max_stored_bytes,
                    " max_submissions_per_minute=", quotas.max_submissions_per_minute, "\n");
  }
  return out;
}

void CheckConfig(const AuthConfig& config) {
  for (const std::string& tenant : config.tenants) FUZZ_CHECK(recal::IsTenantName(tenant), "tenant '", tenant, "'");
  for (const auto& [tenant, q] : config.quotas) {
    FUZZ_CHECK(config.tenants.count(tenant), "quotas of an unlisted tenant '", tenant, "'");
    FUZZ_CHECK(q.max_active_jobs >= 0 && q.max_stored_bytes >= 0 && q.max_submissions_per_minute >= 0, "quota < 0");
  }
  for (const auto& [hash, p] : config.tokens) {
    FUZZ_CHECK(hash.size() == 64 && hash.find_first_not_of("0123456789abcdef") == std::string::npos, "hash ", hash);
    FUZZ_CHECK(config.tenants.count(p.tenant) && p.name == absl::StrCat("token:", hash.substr(0, 12)), "token ", hash);
  }
  for (const auto& [name, p] : config.certs) {
    FUZZ_CHECK(!name.empty() && config.tenants.count(p.tenant) && p.name == absl::StrCat("cert:", name), "cert ", name);
    FUZZ_CHECK(name.find_first_of("\"#\n") == std::string::npos, "cert name '", name, "'");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = recal::auth::ParseAuthFile(text);
  if (!config.ok()) {
    recal::fuzz::CheckRefusal(config.status(), "ParseAuthFile");
    FUZZ_CHECK(config.status().code() == absl::StatusCode::kInvalidArgument &&
                   absl::StartsWith(config.status().message(), "line "),
               config.status().ToString());
    return 0;
  }
  CheckConfig(*config);

  const std::string rendered = Render(*config);
  auto again = recal::auth::ParseAuthFile(rendered);
  FUZZ_CHECK(again.ok(), "the config written back does not parse: ", again.status().ToString(), "\n", rendered);
  FUZZ_CHECK(SameMaps(config->tokens, again->tokens, [](auto& a, auto& b) { return Same(a, b); }) &&
                 SameMaps(config->certs, again->certs, [](auto& a, auto& b) { return Same(a, b); }) &&
                 SameMaps(config->quotas, again->quotas, [](auto& a, auto& b) { return Same(a, b); }) &&
                 config->tenants == again->tenants,
             "the config written back parses to another config:\n", rendered);

  // The server's way in: the file from disk, then calls.
  const std::string path = recal::fuzz::ScratchDir() + "/auth.txt";
  recal::fuzz::WriteFileOrDie(path, text);
  auto authenticator = recal::auth::Authenticator::FromFile(path);
  FUZZ_CHECK(authenticator.ok(), "a file that parses does not load: ", authenticator.status().ToString());
  for (const auto& [name, p] : config->certs) {
    auto who = (*authenticator)->Authenticate(std::nullopt, {name});
    FUZZ_CHECK(who.ok() && Same(*who, p), "cert:", name, " does not authenticate as itself");
  }
  for (const std::optional<std::string>& authorization :
       {std::optional<std::string>(text), std::optional<std::string>("Bearer " + text), std::optional<std::string>()}) {
    auto who = (*authenticator)->Authenticate(authorization, {text});
    if (!who.ok()) {
      recal::fuzz::CheckRefusal(who.status(), "Authenticate");
      FUZZ_CHECK(who.status().code() == absl::StatusCode::kUnauthenticated, who.status().ToString());
    }
  }
  return 0;
}
