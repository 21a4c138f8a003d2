// SHA-256 over bytes and files (OpenSSL EVP), as lowercase hex: the digest that names
// models and blobs. Shared by client (to announce an upload's digest) and server (to check it).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal {

// Incremental hashing, for inputs that arrive in pieces (uploads, files). Not thread-safe.
// A moved-from Sha256 may only be destroyed or assigned to.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view bytes);
  // The digest of everything passed to Update so far, as 64 lowercase hex characters.
  // Finishes the hash: the object starts over (as if new) afterwards.
  std::string HexDigest();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

std::string Sha256Hex(absl::string_view bytes);

// Streams the file (never holds it whole in memory). NOT_FOUND / errno-based errors name
// the path.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

// Whether `s` is a digest as Sha256 prints it: exactly 64 lowercase hex characters.
bool IsSha256Hex(absl::string_view s);

}  // namespace recal
