// `recalctl token new`: a fresh bearer token, and the line of the server's --auth_file that
// grants it. Needs no server: the server keeps only the token's digest, so the token is
// made where it will be used and shown once.
#include <google/protobuf/struct.pb.h>
#include <openssl/rand.h>

#include <cstdio>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/recalctl/commands.h"
#include "client/recalctl/exit_codes.h"
#include "client/recalctl/output.h"
#include "common/sha256.h"
#include "common/tenant_name.h"

namespace recal::ctl {
namespace {

constexpr char kTokenPrefix[] = "recal_";  // makes a leaked token easy to recognise (secret scanners)
constexpr int kTokenBytes = 32;

bool IsRole(const std::string& role) { return role == "read" || role == "submit" || role == "admin"; }

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[kTokenBytes];
  // OpenSSL's generator, seeded by the kernel (getrandom), as the client's TLS already uses.
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    return absl::InternalError("no random bytes for a token (OpenSSL's RAND_bytes failed)");
  }
  return absl::StrCat(kTokenPrefix,
                      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes))));
}

}  // namespace

int Token(const Args& args, bool json, bool quiet) {
  if (auto s = args.AllowOnly({"tenant", "role"}); !s.ok()) return UsageError(s);
  if (args.positional().size() != 1 || args.positional()[0] != "new") {
    return UsageError(absl::InvalidArgumentError("'token' takes one subcommand: token new --tenant T --role R"));
  }
  if (!args.Has("tenant") || !args.Has("role")) {
    return UsageError(absl::InvalidArgumentError("'token new' needs --tenant T and --role R"));
  }
  const std::string tenant = args.Get("tenant");
  if (!IsTenantName(tenant)) {
    return UsageError(absl::InvalidArgumentError(
        absl::StrCat("--tenant must be 1 to 64 letters, digits, '_', '.' or '-', not '", tenant, "'")));
  }
  const std::string role = args.Get("role");
  if (!IsRole(role)) {
    return UsageError(
        absl::InvalidArgumentError(absl::StrCat("--role must be read, submit or admin, not '", role, "'")));
  }
  auto token = NewToken();
  if (!token.ok()) return Fail(token.status());
  const std::string auth_line =
      absl::StrCat("token-sha256:", Sha256Hex(*token), " tenant=", tenant, " role=", role);

  std::string out;
  if (json) {
    google::protobuf::Struct result;
    auto& fields = *result.mutable_fields();
    fields["token"].set_string_value(*token);
    fields["auth_line"].set_string_value(auth_line);
    fields["tenant"].set_string_value(tenant);
    fields["role"].set_string_value(role);
    out = ToJson(result);
  } else {
    out = absl::StrCat(*token, "\n", auth_line, "\n");
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  if (!quiet) {
    std::fputs(
        "recalctl: line 1 is the token, for its user; line 2 goes into the server's --auth_file.\n"
        "recalctl: the server keeps only the token's sha256: this is the only time it is shown.\n",
        stderr);
  }
  return kOk;
}

}  // namespace recal::ctl
