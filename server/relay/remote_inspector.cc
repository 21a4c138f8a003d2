#include "server/relay/remote_inspector.h"

#include <algorithm>
#include <fstream>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "recal/internal/v1/inspection.grpc.pb.h"
#include "server/log/log.h"

namespace recal::relay {
namespace {

constexpr char kStartAWorker[] =
    "no worker process is reachable to inspect the upload: start a --role=worker with --internal_token_file";

// A worker this replica cannot use, as opposed to its verdict on the model.
bool PassOver(const absl::Status& status) { return absl::IsUnavailable(status) || absl::IsUnauthenticated(status); }

}  // namespace

absl::StatusOr<v1::Model> RemoteInspector::InspectAt(const std::string& address, const std::string& model_path) {
  std::ifstream archive(model_path, std::ios::binary | std::ios::ate);
  if (!archive) return absl::InternalError(absl::StrCat("cannot read the staged archive ", model_path));
  const int64_t size = archive.tellg();
  archive.seekg(0);
  auto stub = internal::v1::ModelInspection::NewStub(workers_->ChannelTo(address));
  grpc::ClientContext call;
  workers_->Authorize(call);
  call.set_deadline(absl::ToChronoTime(absl::Now() + options_.deadline));
  // Cancelled at shutdown (RelayClient::CloseAll), which would otherwise wait on the worker.
  workers_->Track(&call);
  absl::Cleanup untrack = [this, &call] { workers_->Untrack(&call); };
  internal::v1::InspectModelResponse response;
  auto writer = stub->InspectModel(&call, &response);
  internal::v1::InspectModelRequest message;
  message.set_size(size);
  const int chunk_bytes = std::max(1, std::min(options_.chunk_bytes, workers_->max_message_bytes() / 2));
  std::string chunk(static_cast<size_t>(chunk_bytes), '\0');
  // A write that fails means the worker ended the call (a refusal, or gone): Finish says which.
  bool open = writer->Write(message);
  for (int64_t sent = 0; open && sent < size;) {
    archive.read(chunk.data(), std::min<int64_t>(chunk_bytes, size - sent));
    if (archive.gcount() <= 0) {
      call.TryCancel();
      writer->Finish();  // the cancelled call's end
      return absl::InternalError(absl::StrCat("the staged archive ", model_path, " ended before ", size, " bytes"));
    }
    message.set_chunk(chunk.data(), static_cast<size_t>(archive.gcount()));
    sent += archive.gcount();
    open = writer->Write(message);
  }
  if (open) writer->WritesDone();
  const absl::Status status = FromGrpcStatus(writer->Finish());
  if (absl::IsUnauthenticated(status)) {
    return absl::UnauthenticatedError(absl::StrCat(
        status.message(), ": it refused this replica's cluster secret; give every api replica and worker the "
                          "same --internal_token_file"));
  }
  if (!status.ok()) return status;
  v1::Model model;
  model.mutable_layers()->Swap(response.mutable_layers());
  model.mutable_inputs()->Swap(response.mutable_inputs());
  return model;
}

absl::StatusOr<v1::Model> RemoteInspector::Inspect(const std::string& model_path) {
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
    auto layers = InspectAt(address, model_path);
    if (absl::IsCancelled(layers.status())) {  // this process is shutting down: no verdict
      return absl::UnavailableError("the server is shutting down; finish the upload again");
    }
    if (!PassOver(layers.status())) return layers;
    log::Warning("recal-server: a worker could not inspect an upload; trying the next",
                 {{"worker", address}, {"error", std::string(layers.status().message())}});
    passed_over.push_back(absl::StrCat(address, ": ", layers.status().message()));
  }
  return absl::UnavailableError(absl::StrCat(kStartAWorker, " (", absl::StrJoin(passed_over, "; "), ")"));
}

}  // namespace recal::relay
