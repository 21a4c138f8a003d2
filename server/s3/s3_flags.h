// The object-storage flags recal-run and recal-server share (--s3_endpoint, --s3_region,
// --s3_addressing, --s3_credentials_dir, --s3_profile): defined once here, so both binaries
// spell and document them the same way. Linked only into binaries (absl flags are global).
#pragma once

#include "server/s3/s3_config.h"

namespace recal::s3 {

// What the flags say (empty: not given; s3_config.h resolves the defaults).
S3Settings S3SettingsFromFlags();

}  // namespace recal::s3
