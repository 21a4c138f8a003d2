// The auth file (--auth_file): who may call, in which tenant, with which role, and each
// tenant's quotas. One entry a line; '#' starts a comment; values with spaces in "quotes".
//
//   token-sha256:<64 hex> tenant=<name> role=<read|submit|admin> [quota=N ...]
//   cert:<certificate subject or SAN> tenant=<name> role=<role> [quota=N ...]
//   tenant <name> [max_active_jobs=N] [max_stored_bytes=N] [max_submissions_per_minute=N]
//                 [max_concurrent_inspections=N] [max_running_jobs=N] [keep_versions=N]
//                 [keep_results_days=N]
//
// The server keeps only the SHA-256 of a bearer token, never the token. Quotas may follow a
// credential's line or stand on a tenant line; a tenant's quota given twice with different
// values is an error. 0 or absent: no limit. keep_versions and keep_results_days are the
// tenant's retention (docs/retention.md): absent, the server's defaults (flags); 0, keep all.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal::auth {

// Each role may do what the one before it may, and more.
enum class Role { kRead = 0, kSubmit = 1, kAdmin = 2 };
const char* RoleName(Role role);

struct Principal {
  std::string tenant;
  Role role = Role::kRead;
  // For logs: "token:<first 12 hex of its hash>" or "cert:<name>"; never a secret.
  std::string name;
};

// What a retention setting holds when the auth file does not give one: the server's default.
inline constexpr int64_t kRetentionDefault = -1;

struct TenantQuotas {
  int64_t max_active_jobs = 0;
  int64_t max_stored_bytes = 0;  // models, results and unfinished uploads
  int64_t max_submissions_per_minute = 0;
  int64_t max_concurrent_inspections = 0;  // uploads inspected at once; 0: the server's default
  int64_t max_running_jobs = 0;  // jobs (and shards) on a worker at once, in the cluster; 0: the server's default
  int64_t keep_versions = kRetentionDefault;      // the newest versions kept of each model name
  int64_t keep_results_days = kRetentionDefault;  // how long an ended job and its results stay
};

struct AuthConfig {
  std::map<std::string, Principal> tokens;  // by the hex SHA-256 of the token
  std::map<std::string, Principal> certs;   // by certificate subject or SAN
  std::map<std::string, TenantQuotas> quotas;
  std::set<std::string> tenants;  // every tenant named anywhere in the file
};

// INVALID_ARGUMENT naming the line and what is wrong with it.
absl::StatusOr<AuthConfig> ParseAuthFile(absl::string_view text);

}  // namespace recal::auth
