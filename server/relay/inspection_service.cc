#include "server/relay/inspection_service.h"

#include <filesystem>
#include <fstream>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "server/log/log.h"

namespace recal::relay {
namespace fs = std::filesystem;

using internal::v1::InspectModelRequest;
using internal::v1::InspectModelResponse;

namespace {

grpc::Status Unauthenticated() {
  return ToGrpcStatus(absl::UnauthenticatedError("this endpoint serves the cluster's own processes only"));
}

}  // namespace

bool InspectionService::Admits(grpc::ServerContext* context, absl::string_view method) {
  if (secret_.Admits(*context)) return true;
  log::WarnLimited(refused_log_, log::PeerHost(context->peer()), "internal call refused: no valid cluster secret",
                   {{"method", std::string(method)}, {"peer", context->peer()}});
  return false;
}

template <typename Reader>
absl::StatusOr<int64_t> InspectionService::ReadSize(Reader* reader) const {
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

template <typename Reader>
absl::Status InspectionService::ReceiveArchive(Reader* reader, int64_t size, const std::string& path) const {
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

template <typename Reader>
absl::StatusOr<v1::Model> InspectionService::ReceiveAndInspect(
    grpc::ServerContext* context, Reader* reader, int64_t size, jobs::ModelInspector::Room& room) {
  const fs::path dir = fs::path(options_.scratch_root) /
                       absl::StrFormat("inspect-%016x", absl::Uniform<uint64_t>(absl::BitGen()));
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", error.message()));
  absl::Cleanup remove = [&dir] {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  };
  const std::string path = (dir / "archive").string();
  RECAL_RETURN_IF_ERROR(ReceiveArchive(reader, size, path));
  auto model = room.Inspect(path);
  log::Info("recal-server: inspected an upload for an api replica",
            {{"peer", context->peer()},
             {"bytes", size},
             {"outcome", model.ok() ? absl::StrCat(model->layers_size(), " BatchNorm layers")
                                    : std::string(absl::StatusCodeToString(model.status().code()))}});
  return model;
}

grpc::Status InspectionService::InspectModel(grpc::ServerContext* context,
                                             grpc::ServerReader<InspectModelRequest>* reader,
                                             internal::v1::InspectModelResponse* response) {
  if (!Admits(context, "ModelInspection.InspectModel")) return Unauthenticated();
  const absl::StatusOr<int64_t> size = ReadSize(reader);
  if (!size.ok()) return ToGrpcStatus(size.status());
  // The inspector's own Inspect, which waits for this host's room once the archive is here.
  jobs::UnboundedRoom room(inspector_);
  auto model = ReceiveAndInspect(context, reader, *size, room);
  if (!model.ok()) return ToGrpcStatus(model.status());
  response->mutable_layers()->Swap(model->mutable_layers());
  response->mutable_inputs()->Swap(model->mutable_inputs());
  return grpc::Status::OK;
}

grpc::Status InspectionService::ReserveAndInspect(
    grpc::ServerContext* context, grpc::ServerReaderWriter<InspectModelResponse, InspectModelRequest>* stream) {
  if (!Admits(context, "ModelInspection.ReserveAndInspect")) return Unauthenticated();
  const absl::StatusOr<int64_t> size = ReadSize(stream);
  if (!size.ok()) return ToGrpcStatus(size.status());
  // Held until this returns: however the call ends, the room is given back.
  absl::StatusOr<std::unique_ptr<jobs::ModelInspector::Room>> room = inspector_->Reserve(*size);
  if (!room.ok()) return ToGrpcStatus(room.status());
  InspectModelResponse answer;
  answer.set_reserved(true);
  if (!stream->Write(answer)) return ToGrpcStatus(absl::CancelledError("the api replica went away"));
  auto model = ReceiveAndInspect(context, stream, *size, **room);
  if (!model.ok()) return ToGrpcStatus(model.status());
  answer.Clear();
  answer.mutable_layers()->Swap(model->mutable_layers());
  answer.mutable_inputs()->Swap(model->mutable_inputs());
  stream->Write(answer);
  return grpc::Status::OK;
}

}  // namespace recal::relay
