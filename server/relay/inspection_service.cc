#include "server/relay/inspection_service.h"

#include <filesystem>
#include <fstream>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "server/log/log.h"

namespace recal::relay {
namespace fs = std::filesystem;

using internal::v1::InspectModelRequest;

absl::StatusOr<int64_t> InspectionService::ReadSize(grpc::ServerReader<InspectModelRequest>* reader) const {
  InspectModelRequest first;
  if (!reader->Read(&first) || first.part_case() != InspectModelRequest::kSize || first.size() <= 0) {
    return absl::InvalidArgumentError("the first message gives the archive's size, a positive number of bytes");
  }
  if (first.size() > options_.max_model_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("an archive of ", first.size(),
                                                     " bytes exceeds this worker's limit of ",
                                                     options_.max_model_bytes, " (--max_model_bytes)"));
  }
  return first.size();
}

absl::Status InspectionService::ReceiveArchive(grpc::ServerReader<InspectModelRequest>* reader, int64_t size,
                                               const std::string& path) const {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) return absl::InternalError(absl::StrCat("cannot write ", path));
  int64_t received = 0;
  InspectModelRequest message;
  while (reader->Read(&message)) {
    if (message.part_case() != InspectModelRequest::kChunk) {
      return absl::InvalidArgumentError("after the size, every message is a chunk of the archive");
    }
    if (static_cast<int64_t>(message.chunk().size()) > size - received) {
      return absl::InvalidArgumentError(absl::StrCat("the archive runs past its declared size of ", size, " bytes"));
    }
    file.write(message.chunk().data(), static_cast<std::streamsize>(message.chunk().size()));
    received += static_cast<int64_t>(message.chunk().size());
  }
  file.close();
  if (!file) return absl::InternalError(absl::StrCat("cannot write ", path));
  if (received != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the archive ended after ", received, " of its declared ", size, " bytes"));
  }
  return absl::OkStatus();
}

grpc::Status InspectionService::InspectModel(grpc::ServerContext* context,
                                             grpc::ServerReader<InspectModelRequest>* reader,
                                             internal::v1::InspectModelResponse* response) {
  if (!secret_.Admits(*context)) {
    log::WarnLimited(refused_log_, log::PeerHost(context->peer()), "internal call refused: no valid cluster secret",
                     {{"method", "ModelInspection.InspectModel"}, {"peer", context->peer()}});
    return ToGrpcStatus(absl::UnauthenticatedError("this endpoint serves the cluster's own processes only"));
  }
  const absl::StatusOr<int64_t> size = ReadSize(reader);
  if (!size.ok()) return ToGrpcStatus(size.status());
  const fs::path dir = fs::path(options_.scratch_root) /
                       absl::StrFormat("inspect-%016x", absl::Uniform<uint64_t>(absl::BitGen()));
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return ToGrpcStatus(absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", error.message())));
  absl::Cleanup remove = [&dir] {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  };
  const std::string path = (dir / "archive").string();
  if (absl::Status received = ReceiveArchive(reader, *size, path); !received.ok()) return ToGrpcStatus(received);
  auto model = inspector_->Inspect(path);
  log::Info("recal-server: inspected an upload for an api replica",
            {{"peer", context->peer()},
             {"bytes", *size},
             {"outcome", model.ok() ? absl::StrCat(model->layers_size(), " BatchNorm layers")
                                    : std::string(absl::StatusCodeToString(model.status().code()))}});
  if (!model.ok()) return ToGrpcStatus(model.status());
  response->mutable_layers()->Swap(model->mutable_layers());
  response->mutable_inputs()->Swap(model->mutable_inputs());
  return grpc::Status::OK;
}

}  // namespace recal::relay
