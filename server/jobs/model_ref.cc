#include "server/jobs/model_ref.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace recal::jobs {
namespace {

constexpr absl::string_view kDigestScheme = "sha256:";
constexpr int kDigestHexDigits = 64;
constexpr absl::string_view kForms =
    "name a model as sha256:<64 hex digits>, a digest prefix of at least 6 hex digits, NAME or NAME:VERSION";

bool AllHex(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isxdigit(c); });
}

bool AllDigits(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isdigit(c); });
}

// A digest or a prefix of one, "sha256:" already taken off.
absl::StatusOr<ModelRef> ParseDigest(absl::string_view text, absl::string_view hex) {
  if (!AllHex(hex) || hex.size() < kMinDigestPrefix || hex.size() > kDigestHexDigits) {
    return absl::InvalidArgumentError(absl::StrCat("model '", text, "': a digest is ", kMinDigestPrefix, " to ",
                                                   kDigestHexDigits, " hex digits after sha256:; ", kForms));
  }
  ModelRef ref;
  ref.kind = hex.size() == kDigestHexDigits ? ModelRef::Kind::kId : ModelRef::Kind::kPrefix;
  ref.digest = absl::AsciiStrToLower(hex);  // digests are stored in lowercase
  return ref;
}

}  // namespace

absl::Status CheckModelName(absl::string_view name) {
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("model name '", name, "' ", why));
  };
  if (name.empty()) return refuse("is empty");
  if (name.size() > kMaxModelNameBytes) return refuse(absl::StrCat("is longer than ", kMaxModelNameBytes, " bytes"));
  for (const char c : name) {
    if (c == ':' || c == '/') return refuse("may not contain ':' (it separates the version) or '/'");
    if (absl::ascii_iscntrl(c)) return refuse("may not contain control characters");
  }
  if (absl::ascii_isspace(name.front()) || absl::ascii_isspace(name.back())) {
    return refuse("may not begin or end with a space");
  }
  if (name == kDigestScheme.substr(0, kDigestScheme.size() - 1)) return refuse("is reserved for digests");
  if (AllHex(name) && name.size() >= kMinDigestPrefix) {
    return refuse("would read as a digest prefix (hex digits only); add a letter or a suffix such as .pt");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelRef> ParseModelRef(absl::string_view text) {
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat("no model given; ", kForms));
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, kDigestScheme)) return ParseDigest(text, rest);
  if (AllHex(text) && text.size() >= kMinDigestPrefix) return ParseDigest(text, text);
  ModelRef ref;
  ref.kind = ModelRef::Kind::kName;
  const size_t colon = text.find(':');
  ref.name = std::string(text.substr(0, colon));
  if (colon != absl::string_view::npos) {
    const absl::string_view version = text.substr(colon + 1);
    if (!AllDigits(version) || !absl::SimpleAtoi(version, &ref.version) || ref.version < 1) {
      return absl::InvalidArgumentError(absl::StrCat("model '", text, "': the version after ':' is a number from 1 ",
                                                     "(NAME:VERSION), or leave it out for the latest; ", kForms));
    }
  }
  if (absl::Status name = CheckModelName(ref.name); !name.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("model '", text, "': ", name.message(), "; ", kForms));
  }
  return ref;
}

}  // namespace recal::jobs
