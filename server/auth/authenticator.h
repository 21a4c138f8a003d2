// Who is calling: a bearer token (looked up by its SHA-256) or the names of a verified client
// certificate, against the auth file loaded now. Reload() swaps in a new file atomically and
// keeps the old one if the new one does not parse; calls in flight keep the config they began
// with. Without an auth file the server is open: every caller is an admin of the default
// tenant (and the server listens on loopback only, see server/main.cc). Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/auth/auth_file.h"

namespace recal::auth {

class Authenticator {
 public:
  // Reads and parses `path` (the error names the file and line).
  static absl::StatusOr<std::unique_ptr<Authenticator>> FromFile(const std::string& path);
  // No credentials: everyone is admin of `default_tenant`.
  static std::unique_ptr<Authenticator> Open(const std::string& default_tenant);

  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

  // Re-reads the file; on any error the current config stays and the error is returned.
  absl::Status Reload();

  // `authorization`: the call's "authorization" metadata, if any ("Bearer <token>");
  // `certificate_names`: the subject and SANs of the peer's verified certificate, if any.
  // A bearer token, when sent, decides alone. UNAUTHENTICATED: none, or none known.
  absl::StatusOr<Principal> Authenticate(const std::optional<std::string>& authorization,
                                         const std::vector<std::string>& certificate_names) const;

  TenantQuotas QuotasOf(const std::string& tenant) const;
  std::vector<std::string> Tenants() const;

 private:
  Authenticator(std::string path, std::shared_ptr<const AuthConfig> config, std::string open_tenant)
      : path_(std::move(path)), open_tenant_(std::move(open_tenant)), config_(std::move(config)) {}
  std::shared_ptr<const AuthConfig> config() const;

  const std::string path_;
  const std::string open_tenant_;
  mutable std::mutex mu_;
  std::shared_ptr<const AuthConfig> config_;
};

// PERMISSION_DENIED unless `principal`'s role is at least `needed`, naming what was tried.
absl::Status Authorize(const Principal& principal, Role needed, absl::string_view action);

}  // namespace recal::auth
