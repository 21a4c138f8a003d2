#include "common/version.h"

namespace recal {

const char* Version() { return RECAL_VERSION; }
const char* LibTorchVersion() { return RECAL_LIBTORCH_VERSION; }

}  // namespace recal
