// Model references as clients send them (GetModelRequest.id, DeleteModelRequest.id,
// JobSpec.model_id) and model names as uploads give them: server/jobs/model_ref.cc, the one
// parser of both.
//
// Contract: garbage is INVALID_ARGUMENT with a message; a digest or prefix that parses is
// lowercase hex of the right length; a name that parses passes CheckModelName, and its
// reference ("name" or "name:version") parses back to the same name and version; every name
// an upload may use reads back as itself (so a model can always be named by its name).
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_util.h"
#include "server/jobs/model_ref.h"

namespace {

using recal::jobs::CheckModelName;
using recal::jobs::kMinDigestPrefix;
using recal::jobs::ModelRef;
using recal::jobs::ParseModelRef;

bool LowerHex(const std::string& s) {
  for (const char c : s) {
    if (!absl::ascii_isxdigit(c) || absl::ascii_isupper(c)) return false;
  }
  return true;
}

void CheckParsed(const std::string& text, const ModelRef& ref) {
  switch (ref.kind) {
    case ModelRef::Kind::kId:
      FUZZ_CHECK(ref.digest.size() == 64 && LowerHex(ref.digest), "digest '", ref.digest, "' of '", text, "'");
      return;
    case ModelRef::Kind::kPrefix:
      FUZZ_CHECK(ref.digest.size() >= static_cast<size_t>(kMinDigestPrefix) && ref.digest.size() < 64 &&
                     LowerHex(ref.digest),
                 "prefix '", ref.digest, "' of '", text, "'");
      return;
    case ModelRef::Kind::kName: {
      FUZZ_CHECK(CheckModelName(ref.name).ok(), "name '", ref.name, "' of '", text, "'");
      FUZZ_CHECK(ref.version >= 0, "version ", ref.version, " of '", text, "'");
      const std::string again = ref.version == 0 ? ref.name : absl::StrCat(ref.name, ":", ref.version);
      absl::StatusOr<ModelRef> back = ParseModelRef(again);
      FUZZ_CHECK(back.ok() && back->kind == ModelRef::Kind::kName && back->name == ref.name &&
                     back->version == ref.version,
                 "'", again, "' (from '", text, "') does not read back");
      return;
    }
  }
  FUZZ_CHECK(false, "unknown kind of '", text, "'");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ModelRef> ref = ParseModelRef(text);
  if (ref.ok()) {
    CheckParsed(text, *ref);
  } else {
    recal::fuzz::CheckRefusal(ref.status(), "ParseModelRef");
    FUZZ_CHECK(absl::IsInvalidArgument(ref.status()), ref.status().ToString());
  }
  const absl::Status name = CheckModelName(text);
  if (name.ok()) {
    FUZZ_CHECK(ref.ok() && ref->kind == ModelRef::Kind::kName && ref->name == text && ref->version == 0,
               "the allowed name '", text, "' does not read back as itself");
  } else {
    recal::fuzz::CheckRefusal(name, "CheckModelName");
    FUZZ_CHECK(absl::IsInvalidArgument(name), name.ToString());
  }
  return 0;
}
