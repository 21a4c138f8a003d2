// What a client may name a model by (docs/models.md), parsed once where a request comes in:
// "sha256:<64 hex>", a digest prefix of at least kMinDigestPrefix hex digits (with or without
// "sha256:"), "name" (its latest version) or "name:version". And what a model's name may be,
// so that every name can be written as a reference and read back as the same name.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/request_limits.h"

namespace recal::jobs {

// Fewer hex digits would match too many models to be worth a look-up.
inline constexpr int kMinDigestPrefix = 6;
// Longer names are a mistake (a path, a pasted blob), not a name.
inline constexpr int kMaxModelNameBytes = static_cast<int>(limits::kMaxModelNameBytes);

struct ModelRef {
  enum class Kind {
    kId,      // digest: the 64 lowercase hex digits
    kPrefix,  // digest: kMinDigestPrefix..63 lowercase hex digits
    kName,    // name, and version (0: the latest)
  };
  Kind kind = Kind::kId;
  std::string digest;
  std::string name;
  int64_t version = 0;
};

// INVALID_ARGUMENT naming the forms it may take.
absl::StatusOr<ModelRef> ParseModelRef(absl::string_view text);

// Whether an upload may use `name`: 1..kMaxModelNameBytes bytes, no ':' (it separates the
// version) or '/', no control characters, no space at either end, not "sha256", and not
// kMinDigestPrefix or more hex digits alone (which read as a digest prefix).
// INVALID_ARGUMENT saying which rule it breaks.
absl::Status CheckModelName(absl::string_view name);

}  // namespace recal::jobs
