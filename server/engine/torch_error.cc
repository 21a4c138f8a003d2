#include "server/engine/torch_error.h"

#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace recal::engine {

std::string TorchErrorLine(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  absl::string_view text = c10_error ? c10_error->what_without_backtrace() : e.what();
  std::string best;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    line = absl::StripAsciiWhitespace(line);
    if (absl::ConsumePrefix(&line, "RuntimeError: ")) return std::string(line);
    // Lines of the scripted traceback and source excerpts are not the message.
    if (best.empty() && !absl::StartsWith(line, "The following operation failed") &&
        !absl::StartsWith(line, "Traceback")) {
      best = std::string(line);
    }
  }
  return best.empty() ? std::string(text) : best;
}

absl::Status TorchErrorStatus(absl::string_view context, const std::exception& e) {
  return absl::InvalidArgumentError(absl::StrCat(context, ": ", TorchErrorLine(e)));
}

}  // namespace recal::engine
