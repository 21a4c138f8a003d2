#include "common/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace recal {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
  ~Ctx() { EVP_MD_CTX_free(md); }
};

namespace {

// EVP can fail only on allocation failure or a broken OpenSSL install; neither is
// something a caller could act on, and a wrong digest would be worse than a crash.
void Check(int ok, const char* what) {
  if (ok != 1) {
    std::fprintf(stderr, "recal: OpenSSL %s failed for SHA-256\n", what);
    std::abort();
  }
}

}  // namespace

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  Check(ctx_->md != nullptr, "EVP_MD_CTX_new");
  Check(EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr), "EVP_DigestInit_ex");
}

Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::Update(absl::string_view bytes) {
  if (bytes.empty()) return;
  Check(EVP_DigestUpdate(ctx_->md, bytes.data(), bytes.size()), "EVP_DigestUpdate");
}

std::string Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  Check(EVP_DigestFinal_ex(ctx_->md, digest, &len), "EVP_DigestFinal_ex");
  Check(EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr), "EVP_DigestInit_ex");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex(2 * len, '0');
  for (unsigned int i = 0; i < len; ++i) {
    hex[2 * i] = kHex[digest[i] >> 4];
    hex[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return hex;
}

std::string Sha256Hex(absl::string_view bytes) {
  Sha256 h;
  h.Update(bytes);
  return h.HexDigest();
}

absl::StatusOr<std::string> Sha256OfFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open '", path, "' to hash it"));
  }
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat("cannot read '", path, "' to hash it"));
    }
    h.Update(absl::string_view(buf.data(), static_cast<size_t>(n)));
  }
  ::close(fd);
  return h.HexDigest();
}

bool IsSha256Hex(absl::string_view s) {
  if (s.size() != 64) return false;
  for (const char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace recal
