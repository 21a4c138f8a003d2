#include "server/relay/relay_secret.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/sha256.h"

namespace recal::relay {
namespace {

constexpr char kHeader[] = "x-recal-cluster-secret";
constexpr size_t kMinLength = 32;

// Equal digests, in time that does not depend on where they differ.
bool SameDigest(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ |= static_cast<unsigned char>(a[i] ^ b[i]);
  return differ == 0;
}

}  // namespace

absl::StatusOr<RelaySecret> RelaySecret::FromFile(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  if (!file || !std::getline(file, line)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the cluster secret from ", path));
  }
  std::string secret(absl::StripAsciiWhitespace(line));
  if (secret.size() < kMinLength) {
    return absl::InvalidArgumentError(absl::StrCat("the cluster secret in ", path, " has ", secret.size(),
                                                   " characters; use at least ", kMinLength,
                                                   " random ones (e.g. a token from 'recalctl token new')"));
  }
  std::string digest = Sha256Hex(secret);
  return RelaySecret(std::move(secret), std::move(digest));
}

bool RelaySecret::Admits(const grpc::ServerContext& context) const {
  const auto& metadata = context.client_metadata();
  auto found = metadata.find(kHeader);
  if (found == metadata.end()) return false;
  return SameDigest(Sha256Hex(absl::string_view(found->second.data(), found->second.size())), digest_);
}

void RelaySecret::AttachTo(grpc::ClientContext& context) const { context.AddMetadata(kHeader, secret_); }

}  // namespace recal::relay
