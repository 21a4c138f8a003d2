#include "server/store/blob_store.h"

#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace recal::store {

absl::Status ValidateDigest(const std::string& hex) {
  if (IsSha256Hex(hex)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("'", hex, "' is not a SHA-256 digest: expected 64 lowercase hex characters"));
}

}  // namespace recal::store
