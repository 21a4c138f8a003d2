#include "server/auth/auth_file.h"

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/tenant_name.h"

namespace recal::auth {
namespace {

// Splits a line on blanks; "..." keeps blanks (no escapes inside: names do not need them).
absl::StatusOr<std::vector<std::string>> Words(absl::string_view line) {
  std::vector<std::string> words;
  std::string word;
  bool quoted = false, any = false;
  for (const char c : line) {
    if (c == '"') {
      quoted = !quoted;
      any = true;
    } else if (!quoted && absl::ascii_isspace(static_cast<unsigned char>(c))) {
      if (any) words.push_back(std::move(word));
      word.clear();
      any = false;
    } else {
      word.push_back(c);
      any = true;
    }
  }
  if (quoted) return absl::InvalidArgumentError("a quote is not closed");
  if (any) words.push_back(std::move(word));
  return words;
}

bool IsLowerHex(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  if (name == "read") return Role::kRead;
  if (name == "submit") return Role::kSubmit;
  if (name == "admin") return Role::kAdmin;
  return absl::InvalidArgumentError(absl::StrCat("role '", name, "' is not read, submit or admin"));
}

// Sets one quota of `tenant`, refusing a different value set before.
absl::Status SetQuota(AuthConfig& config, std::map<std::string, std::map<std::string, int64_t>>& seen,
                      const std::string& tenant, absl::string_view key, absl::string_view value) {
  TenantQuotas& quotas = config.quotas[tenant];
  int64_t* field = key == "max_active_jobs"              ? &quotas.max_active_jobs
                   : key == "max_stored_bytes"           ? &quotas.max_stored_bytes
                   : key == "max_submissions_per_minute" ? &quotas.max_submissions_per_minute
                   : key == "max_concurrent_inspections" ? &quotas.max_concurrent_inspections
                   : key == "max_running_jobs"           ? &quotas.max_running_jobs
                   : key == "keep_versions"              ? &quotas.keep_versions
                   : key == "keep_results_days"          ? &quotas.keep_results_days
                                                         : nullptr;
  if (field == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown key '", key,
                     "' (tenant, role, max_active_jobs, max_stored_bytes, max_submissions_per_minute, "
                     "max_concurrent_inspections, max_running_jobs, keep_versions, keep_results_days)"));
  }
  int64_t number = 0;
  if (!absl::SimpleAtoi(value, &number) || number < 0) {
    return absl::InvalidArgumentError(absl::StrCat(key, "=", value, " is not a whole number >= 0"));
  }
  auto before = seen[tenant].find(std::string(key));
  if (before != seen[tenant].end() && before->second != number) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant ", tenant, " has ", key, "=", before->second, " already; it cannot also be ", number));
  }
  seen[tenant][std::string(key)] = number;
  *field = number;
  return absl::OkStatus();
}

absl::Status ParseLine(const std::vector<std::string>& words, AuthConfig& config,
                       std::map<std::string, std::map<std::string, int64_t>>& seen) {
  const std::string& first = words[0];
  if (first == "tenant") {
    if (words.size() < 2 || !IsTenantName(words[1])) {
      return absl::InvalidArgumentError("'tenant' needs a name: [A-Za-z0-9][A-Za-z0-9_.-]*, at most 64");
    }
    config.tenants.insert(words[1]);
    config.quotas[words[1]];
    for (size_t i = 2; i < words.size(); ++i) {
      std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
      if (absl::Status s = SetQuota(config, seen, words[1], kv.first, kv.second); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  std::map<std::string, Principal>* into = nullptr;
  std::string key;
  Principal principal;
  if (absl::string_view hash = first; absl::ConsumePrefix(&hash, "token-sha256:")) {
    if (hash.size() != 64 || !IsLowerHex(hash)) {
      return absl::InvalidArgumentError("token-sha256: needs the 64 lowercase hex digits of the token's SHA-256");
    }
    into = &config.tokens;
    key = std::string(hash);
    principal.name = absl::StrCat("token:", hash.substr(0, 12));
  } else if (absl::string_view name = first; absl::ConsumePrefix(&name, "cert:")) {
    if (name.empty()) return absl::InvalidArgumentError("cert: needs the certificate's subject or a SAN");
    into = &config.certs;
    key = std::string(name);
    principal.name = absl::StrCat("cert:", name);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("'", first.substr(0, 40), "' is not token-sha256:<hex>, cert:<name> or tenant <name>"));
  }
  bool has_tenant = false, has_role = false;
  std::vector<std::pair<std::string, std::string>> quotas;
  for (size_t i = 1; i < words.size(); ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
    if (kv.first == "tenant") {
      if (!IsTenantName(kv.second)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tenant '", kv.second, "' is not a name: [A-Za-z0-9][A-Za-z0-9_.-]*, at most 64"));
      }
      principal.tenant = kv.second;
      has_tenant = true;
    } else if (kv.first == "role") {
      auto role = ParseRole(kv.second);
      if (!role.ok()) return role.status();
      principal.role = *role;
      has_role = true;
    } else {
      quotas.push_back(std::move(kv));
    }
  }
  if (!has_tenant || !has_role) return absl::InvalidArgumentError("a credential needs tenant=<name> and role=<role>");
  for (const auto& [k, v] : quotas) {
    if (absl::Status s = SetQuota(config, seen, principal.tenant, k, v); !s.ok()) return s;
  }
  config.tenants.insert(principal.tenant);
  config.quotas[principal.tenant];
  if (!into->emplace(key, principal).second) {
    return absl::InvalidArgumentError(absl::StrCat("the credential ", principal.name, " is listed twice"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kRead: return "read";
    case Role::kSubmit: return "submit";
    case Role::kAdmin: return "admin";
  }
  return "unknown";
}

absl::StatusOr<AuthConfig> ParseAuthFile(absl::string_view text) {
  AuthConfig config;
  std::map<std::string, std::map<std::string, int64_t>> seen;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    auto words = Words(line);
    absl::Status status = words.status();
    if (status.ok() && !words->empty()) status = ParseLine(*words, config, seen);
    if (!status.ok()) return absl::InvalidArgumentError(absl::StrCat("line ", number, ": ", status.message()));
  }
  return config;
}

}  // namespace recal::auth
