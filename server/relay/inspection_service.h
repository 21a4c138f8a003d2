// A worker process's side of remote inspection: the internal endpoint's ModelInspection
// service, through which an api replica (which runs no recal-worker) has this process inspect
// an upload. Only callers that present the cluster secret are served (UNAUTHENTICATED
// otherwise, before anything is written, logged with the peer). The archive is written to a
// scratch directory of its own, never past the size it declared nor --max_model_bytes, and
// inspected by the same ModelInspector as a local upload (WorkerRunner: the sandboxed
// recal-worker, under this host's bounds on inspections); its verdict goes back as it is.
// ReserveAndInspect takes the host's room before a byte of the archive is sent (the api
// replica commits the upload only then); InspectModel, for api replicas from before it, once
// the archive is here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  // The host's room first (the inspector's Reserve, under this host's bounds), answered
  // `reserved`; then the archive, inspected in that room.
  grpc::Status ReserveAndInspect(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<internal::v1::InspectModelResponse, internal::v1::InspectModelRequest>* stream)
      override;

 private:
  // Whether the caller presents the cluster secret (logged, limited per peer, when not).
  bool Admits(grpc::ServerContext* context, absl::string_view method);
  // The declared size from the stream's first message: INVALID_ARGUMENT without one,
  // RESOURCE_EXHAUSTED over max_model_bytes.
  template <typename Reader>
  absl::StatusOr<int64_t> ReadSize(Reader* reader) const;
  // The rest of the stream into `path`: exactly `size` bytes (INVALID_ARGUMENT otherwise,
  // at the first byte too many).
  template <typename Reader>
  absl::Status ReceiveArchive(Reader* reader, int64_t size, const std::string& path) const;
  // Receives the archive into a scratch directory of its own and inspects it in `room`; the
  // directory goes when this returns.
  template <typename Reader>
  absl::StatusOr<v1::Model> ReceiveAndInspect(grpc::ServerContext* context, Reader* reader,
                                                                    int64_t size, jobs::ModelInspector::Room& room);

  const RelaySecret secret_;
  jobs::ModelInspector* const inspector_;
  const InspectionServiceOptions options_;
  log::RepeatLimiter refused_log_{5, absl::Minutes(1)};
};

}  // namespace recal::relay
