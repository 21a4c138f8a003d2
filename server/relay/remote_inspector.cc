#include "server/relay/remote_inspector.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "recal/internal/v1/inspection.grpc.pb.h"
#include "server/log/log.h"

namespace recal::relay {
namespace {

using internal::v1::InspectModelRequest;
using internal::v1::InspectModelResponse;

constexpr char kStartAWorker[] =
    "no worker process is reachable to inspect the upload: start a --role=worker with --internal_token_file";

// A worker this replica cannot use, as opposed to its verdict on the model.
bool PassOver(const absl::Status& status) { return absl::IsUnavailable(status) || absl::IsUnauthenticated(status); }

// How a call to a worker ended, as this replica reports it: a refused secret says what to fix.
absl::Status Ended(const grpc::Status& finished) {
  const absl::Status status = FromGrpcStatus(finished);
  if (!absl::IsUnauthenticated(status)) return status;
  return absl::UnauthenticatedError(absl::StrCat(
      status.message(), ": it refused this replica's cluster secret; give every api replica and worker the "
                        "same --internal_token_file"));
}

// A call this process cancelled (it is shutting down: RelayClient::CloseAll) is no verdict.
absl::Status ShuttingDownIfCancelled(const absl::Status& status) {
  if (!absl::IsCancelled(status)) return status;
  return absl::UnavailableError("the server is shutting down; finish the upload again");
}

InspectModelRequest SizeMessage(int64_t size) {
  InspectModelRequest message;
  message.set_size(size);
  return message;
}

// The archive at `path` as chunks of at most `chunk_bytes` on `stream`: exactly `size` bytes,
// or until the worker ends the call (then `*open` is false, and its Finish says why).
// INTERNAL when the file holds fewer bytes.
template <typename Stream>
absl::Status SendChunks(Stream& stream, const std::string& path, int64_t size, int chunk_bytes, bool* open) {
  std::ifstream archive(path, std::ios::binary);
  if (!archive) return absl::InternalError(absl::StrCat("cannot read the staged archive ", path));
  InspectModelRequest message;
  std::string chunk(static_cast<size_t>(chunk_bytes), '\0');
  for (int64_t sent = 0; *open && sent < size;) {
    archive.read(chunk.data(), std::min<int64_t>(chunk_bytes, size - sent));
    if (archive.gcount() <= 0) {
      return absl::InternalError(absl::StrCat("the staged archive ", path, " ended before ", size, " bytes"));
    }
    message.set_chunk(chunk.data(), static_cast<size_t>(archive.gcount()));
    sent += archive.gcount();
    *open = stream.Write(message);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ArchiveSize(const std::string& path) {
  std::error_code error;
  const std::uintmax_t size = std::filesystem::file_size(path, error);
  if (error) return absl::InternalError(absl::StrCat("cannot read the staged archive ", path, ": ", error.message()));
  return static_cast<int64_t>(size);
}

// What the worker's inspection says of the model: its layers and its input contract.
v1::Model ModelOf(const InspectModelResponse& answer) {
  v1::Model model;
  *model.mutable_layers() = answer.layers();
  *model.mutable_inputs() = answer.inputs();
  return model;
}

}  // namespace

// A room at one worker: an open ReserveAndInspect call whose worker answered `reserved`, and
// holds its host's room until the call ends (here, when this goes). Tracked by the relay
// client, which cancels it at shutdown.
class RemoteInspector::ReservedCall final : public jobs::ModelInspector::Room {
 public:
  ReservedCall(RelayClient* workers, const std::string& address, int chunk_bytes)
      : workers_(workers),
        chunk_bytes_(chunk_bytes),
        stub_(internal::v1::ModelInspection::NewStub(workers->ChannelTo(address))) {}
  ~ReservedCall() override {
    if (stream_ != nullptr && !finished_) {
      call_.TryCancel();  // the worker gives the room back
      stream_->Finish();
    }
    if (stream_ != nullptr) workers_->Untrack(&call_);
  }

  // Opens the call and waits for the worker's room.
  absl::Status Open(int64_t size, absl::Duration deadline) {
    size_ = size;
    workers_->Authorize(call_);
    call_.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    stream_ = stub_->ReserveAndInspect(&call_);
    workers_->Track(&call_);
    InspectModelResponse answer;
    if (stream_->Write(SizeMessage(size)) && stream_->Read(&answer)) {
      if (answer.reserved()) return absl::OkStatus();
      call_.TryCancel();  // it would wait for the archive
      Finish().IgnoreError();
      return absl::InternalError("the worker answered an inspection's size with something else than room");
    }
    RECAL_RETURN_IF_ERROR(Finish());  // the worker's refusal, or why it cannot be reached
    return absl::InternalError("the worker ended the inspection's call without room or refusal");
  }

  absl::StatusOr<v1::Model> Inspect(const std::string& model_path) override {
    absl::StatusOr<v1::Model> model = Exchange(model_path);
    if (!model.ok()) return ShuttingDownIfCancelled(model.status());
    return model;
  }

 private:
  // The archive for the worker's verdict.
  absl::StatusOr<v1::Model> Exchange(const std::string& model_path) {
    bool open = true;
    if (absl::Status sent = SendChunks(*stream_, model_path, size_, chunk_bytes_, &open); !sent.ok()) return sent;
    if (open) stream_->WritesDone();
    InspectModelResponse answer;
    const bool answered = stream_->Read(&answer);
    RECAL_RETURN_IF_ERROR(Finish());
    if (!answered) return absl::InternalError("the worker ended the inspection without its layers");
    return ModelOf(answer);
  }

  absl::Status Finish() {
    finished_ = true;
    return Ended(stream_->Finish());
  }

  RelayClient* const workers_;
  const int chunk_bytes_;
  const std::unique_ptr<internal::v1::ModelInspection::Stub> stub_;
  int64_t size_ = 0;
  grpc::ClientContext call_;
  std::unique_ptr<grpc::ClientReaderWriter<InspectModelRequest, InspectModelResponse>> stream_;
  bool finished_ = false;
};

// A worker older than ReserveAndInspect (a cluster mid-upgrade): it takes the archive without
// room reserved first, as before.
class RemoteInspector::UnreservedWorker final : public jobs::ModelInspector::Room {
 public:
  UnreservedWorker(RemoteInspector* inspector, std::string address)
      : inspector_(inspector), address_(std::move(address)) {}
  absl::StatusOr<v1::Model> Inspect(const std::string& model_path) override {
    absl::StatusOr<v1::Model> model = inspector_->InspectAt(address_, model_path);
    if (!model.ok()) return ShuttingDownIfCancelled(model.status());
    return model;
  }

 private:
  RemoteInspector* const inspector_;
  const std::string address_;
};

int RemoteInspector::ChunkBytes() const {
  return std::max(1, std::min(options_.chunk_bytes, workers_->max_message_bytes() / 2));
}

absl::StatusOr<v1::Model> RemoteInspector::InspectAt(const std::string& address, const std::string& model_path) {
  RECAL_ASSIGN_OR_RETURN(const int64_t size, ArchiveSize(model_path));
  auto stub = internal::v1::ModelInspection::NewStub(workers_->ChannelTo(address));
  grpc::ClientContext call;
  workers_->Authorize(call);
  call.set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
  // Cancelled at shutdown (RelayClient::CloseAll), which would otherwise wait on the worker.
  workers_->Track(&call);
  absl::Cleanup untrack = [this, &call] { workers_->Untrack(&call); };
  InspectModelResponse response;
  auto writer = stub->InspectModel(&call, &response);
  // A write that fails means the worker ended the call (a refusal, or gone): Finish says which.
  bool open = writer->Write(SizeMessage(size));
  if (absl::Status sent = SendChunks(*writer, model_path, size, ChunkBytes(), &open); !sent.ok()) {
    call.TryCancel();
    writer->Finish();  // the cancelled call's end
    return sent;
  }
  if (open) writer->WritesDone();
  RECAL_RETURN_IF_ERROR(Ended(writer->Finish()));
  return ModelOf(response);
}

absl::StatusOr<std::unique_ptr<jobs::ModelInspector::Room>> RemoteInspector::ReserveAt(const std::string& address,
                                                                                      int64_t archive_bytes) {
  auto room = std::make_unique<ReservedCall>(workers_, address, ChunkBytes());
  RECAL_RETURN_IF_ERROR(room->Open(archive_bytes, options_.deadline));
  return room;
}

absl::StatusOr<std::unique_ptr<jobs::ModelInspector::Room>> RemoteInspector::Reserve(int64_t archive_bytes) {
  auto live = metadata_->LiveWorkerEndpoints(absl::ToUnixMillis(absl::Now() - options_.live_within));
  if (!live.ok()) return live.status();
  if (live->empty()) {
    return absl::UnavailableError(absl::StrCat(kStartAWorker, " (none has been heard from in the last ",
                                               absl::FormatDuration(options_.live_within), ")"));
  }
  // Spread over the workers; each is tried once.
  absl::BitGen random;
  std::shuffle(live->begin(), live->end(), random);
  std::vector<std::string> passed_over;
  for (const std::string& address : *live) {
    absl::StatusOr<std::unique_ptr<Room>> room = ReserveAt(address, archive_bytes);
    if (absl::IsUnimplemented(room.status())) return std::make_unique<UnreservedWorker>(this, address);
    if (absl::IsCancelled(room.status())) return ShuttingDownIfCancelled(room.status());
    if (!PassOver(room.status())) return room;
    log::Warning("recal-server: a worker could not take an upload's inspection; trying the next",
                 {{"worker", address}, {"error", std::string(room.status().message())}});
    passed_over.push_back(absl::StrCat(address, ": ", room.status().message()));
  }
  return absl::UnavailableError(absl::StrCat(kStartAWorker, " (", absl::StrJoin(passed_over, "; "), ")"));
}

absl::StatusOr<v1::Model> RemoteInspector::Inspect(const std::string& model_path) {
  RECAL_ASSIGN_OR_RETURN(const int64_t size, ArchiveSize(model_path));
  RECAL_ASSIGN_OR_RETURN(std::unique_ptr<Room> room, Reserve(size));
  return room->Inspect(model_path);
}

}  // namespace recal::relay
