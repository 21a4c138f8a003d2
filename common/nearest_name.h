// "Did you mean": the known name a mistyped one most likely meant, for the messages of every
// command line (recal-server, recal-run, recalctl).
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace recal {

// The name in `names` nearest `unknown` by edit distance, or one that `unknown` begins (a
// name cut short); "" when none is close enough to be a likely typo.
std::string NearestName(absl::string_view unknown, const std::vector<std::string>& names);

// " (did you mean --NAME?)" for a flag, or "" when no name is near.
std::string DidYouMean(absl::string_view unknown, const std::vector<std::string>& names, absl::string_view prefix = "");

}  // namespace recal
