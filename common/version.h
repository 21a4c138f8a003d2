// What every binary says of itself (--version, recal_build_info, GetServerInfo): the
// project's version and the LibTorch the build was made against.
#pragma once

namespace recal {

// `git describe` at configure time, or RECAL_VERSION when set (a tree without .git).
const char* Version();
// The torch wheel's version the build found (cmake/LibTorch.cmake), e.g. "2.14.1+cpu".
const char* LibTorchVersion();

}  // namespace recal
