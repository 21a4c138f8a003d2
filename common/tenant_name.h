// What may name a tenant: [A-Za-z0-9][A-Za-z0-9_.-]{0,63}. The auth file, recalctl token new,
// --data_root=TENANT=PATH and the upload store (a directory per tenant, so never "." or "..")
// all hold names to this one rule.
#pragma once

#include "absl/strings/string_view.h"

namespace recal {

bool IsTenantName(absl::string_view name);

}  // namespace recal
