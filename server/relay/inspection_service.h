// A worker process's side of remote inspection: the internal endpoint's ModelInspection
// service, through which an api replica (which runs no recal-worker) has this process inspect
// an upload. Only callers that present the cluster secret are served (UNAUTHENTICATED
// otherwise, before anything is written, logged with the peer). The archive is written to a
// scratch directory of its own, never past the size it declared nor --max_model_bytes, and
// inspected by the same ModelInspector as a local upload (WorkerRunner: the sandboxed
// recal-worker, under this host's bounds on inspections); its verdict goes back as it is.
#pragma once

#include <cstdint>
#include <string>

#include "recal/internal/v1/inspection.grpc.pb.h"
#include "server/jobs/model_inspector.h"
#include "server/log/repeat_limiter.h"
#include "server/relay/relay_secret.h"

namespace recal::relay {

struct InspectionServiceOptions {
  int64_t max_model_bytes = 0;  // the largest archive taken (--max_model_bytes)
  std::string scratch_root;     // where received archives are written, each in a directory of its own
};

class InspectionService final : public internal::v1::ModelInspection::Service {
 public:
  InspectionService(RelaySecret secret, jobs::ModelInspector* inspector, InspectionServiceOptions options)
      : secret_(std::move(secret)), inspector_(inspector), options_(std::move(options)) {}

  grpc::Status InspectModel(grpc::ServerContext* context,
                            grpc::ServerReader<internal::v1::InspectModelRequest>* reader,
                            internal::v1::InspectModelResponse* response) override;

 private:
  // The declared size from the stream's first message: INVALID_ARGUMENT without one,
  // RESOURCE_EXHAUSTED over max_model_bytes.
  absl::StatusOr<int64_t> ReadSize(grpc::ServerReader<internal::v1::InspectModelRequest>* reader) const;
  // The rest of the stream into `path`: exactly `size` bytes (INVALID_ARGUMENT otherwise,
  // at the first byte too many).
  absl::Status ReceiveArchive(grpc::ServerReader<internal::v1::InspectModelRequest>* reader, int64_t size,
                              const std::string& path) const;

  const RelaySecret secret_;
  jobs::ModelInspector* const inspector_;
  const InspectionServiceOptions options_;
  log::RepeatLimiter refused_log_{5, absl::Minutes(1)};
};

}  // namespace recal::relay
