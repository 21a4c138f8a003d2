// The one place where absl::Status and grpc::Status meet (server adapters and clients).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace recal {

// The codes are the same numbers (google.rpc.Code); the message is kept.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace recal
