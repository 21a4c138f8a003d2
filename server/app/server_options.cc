#include "server/app/server_options.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace recal::app {

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  if (name == "all") return Role::kAll;
  if (name == "api") return Role::kApi;
  if (name == "worker") return Role::kWorker;
  return absl::InvalidArgumentError(absl::StrCat("--role=", name, " is not all, api or worker"));
}

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kAll:
      return "all";
    case Role::kApi:
      return "api";
    case Role::kWorker:
      return "worker";
  }
  return "all";
}

}  // namespace recal::app
