#include "common/tenant_name.h"

#include <algorithm>

#include "absl/strings/ascii.h"

namespace recal {

bool IsTenantName(absl::string_view name) {
  return !name.empty() && name.size() <= 64 && absl::ascii_isalnum(static_cast<unsigned char>(name[0])) &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
         });
}

}  // namespace recal
