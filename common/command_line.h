// The command line of Recal's binaries that take Abseil flags (recal-server, recal-run,
// recal-worker), with what absl's parser lacks for a person at a terminal: --help lists every
// flag the binary takes (absl's lists only those of a file named after the binary, so flags
// declared in a shared library file were hidden) and exits 0; --version prints the version
// and the LibTorch of the build; an unknown flag is refused naming the nearest known one.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace recal {

// Parses argv into the flags or exits: 0 after --help / --version, 2 for an unknown flag.
// `usage`: what the binary does and its synopsis (the first lines of --help); `build`: what
// --version says of the build besides (a line of its own where not empty). Returns the
// positional arguments (argv[0] first), as absl::ParseCommandLine does.
std::vector<char*> ParseCommandLineOrExit(int argc, char** argv, absl::string_view program, absl::string_view usage,
                                          absl::string_view build = "");

}  // namespace recal
