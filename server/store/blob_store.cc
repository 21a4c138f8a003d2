#include "server/store/blob_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace recal::store {

absl::StatusOr<BlobStore::HeldFile> BlobStore::HoldLocalPath(const std::string& sha256_hex) {
  // The file store's blobs leave only with Remove: nothing to hold.
  RECAL_ASSIGN_OR_RETURN(std::string path, LocalPath(sha256_hex));
  return HeldFile{std::move(path), nullptr};
}

absl::Status ValidateDigest(const std::string& hex) {
  if (IsSha256Hex(hex)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("'", hex, "' is not a SHA-256 digest: expected 64 lowercase hex characters"));
}

}  // namespace recal::store
