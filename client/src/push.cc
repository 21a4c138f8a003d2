// PushBatches: one client stream of batches, ended by a message marked last. A batch larger
// than the server's message limit goes in parts (PushBatchesRequest.batch_continues).
#include "recal/batch_parts.h"

#include "client/src/client_impl.h"

namespace recal {
namespace {

// Room for the message's own fields (job id, dtype, shape, tags) beside the tensor bytes.
constexpr int64_t kMessageOverhead = 64 << 10;
// A server that predates GetServerInfo takes gRPC's default (4 MiB).
constexpr int64_t kDefaultMessageLimit = 4 << 20;

// The bytes of tensor data one message may carry to this server.
int64_t PartBytes(Client& client) {
  absl::StatusOr<v1::ServerInfo> info = client.GetServerInfo();
  const int64_t limit = info.ok() && info->max_message_bytes() > 0 ? info->max_message_bytes() : kDefaultMessageLimit;
  return std::max<int64_t>(limit - kMessageOverhead, 4096);
}

}  // namespace

std::vector<v1::PushBatchesRequest> BatchMessages(std::vector<v1::Tensor>& inputs, int64_t part_bytes) {
  int64_t total = 0;
  for (const v1::Tensor& tensor : inputs) total += static_cast<int64_t>(tensor.data().size());
  std::vector<v1::PushBatchesRequest> parts(1);
  if (total <= part_bytes) {
    for (v1::Tensor& tensor : inputs) *parts[0].add_inputs() = std::move(tensor);
    return parts;
  }
  for (const v1::Tensor& tensor : inputs) {
    v1::Tensor* head = parts[0].add_inputs();
    head->set_dtype(tensor.dtype());
    *head->mutable_shape() = tensor.shape();
  }
  int64_t room = part_bytes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string& data = inputs[i].data();
    for (size_t at = 0; at < data.size();) {
      if (room == 0) {
        parts.back().set_batch_continues(true);
        parts.emplace_back();
        for (size_t k = 0; k < inputs.size(); ++k) parts.back().add_inputs();
        room = part_bytes;
      }
      const size_t n = std::min<size_t>(static_cast<size_t>(room), data.size() - at);
      parts.back().mutable_inputs(static_cast<int>(i))->mutable_data()->append(data, at, n);
      at += n;
      room -= static_cast<int64_t>(n);
    }
  }
  return parts;
}

absl::StatusOr<int64_t> Client::PushBatches(const std::string& job_id, const BatchProducer& next, int shard) {
  const int64_t part_bytes = PartBytes(*this);
  grpc::ClientContext context;
  impl_->Prepare(&context, /*unary=*/false);
  v1::PushBatchesResponse response;
  auto writer = impl_->stub->PushBatches(&context, &response);
  std::vector<v1::Tensor> inputs;
  bool open = true;
  while (open) {
    absl::StatusOr<bool> more = next(&inputs);
    if (!more.ok()) {
      context.TryCancel();
      writer->Finish();
      return more.status();
    }
    if (!*more) {
      v1::PushBatchesRequest message;
      message.set_job_id(job_id);
      message.set_shard(shard);
      message.set_last(true);
      writer->Write(message);
      break;
    }
    for (v1::PushBatchesRequest& message : BatchMessages(inputs, part_bytes)) {
      message.set_job_id(job_id);
      message.set_shard(shard);
      // The server blocks while the job's queue is full (back-pressure); a failed Write
      // means it has ended the call, and Finish says why.
      if (!writer->Write(message)) {
        open = false;
        break;
      }
    }
  }
  writer->WritesDone();
  const absl::Status finished = FromGrpcStatus(writer->Finish());
  if (!finished.ok()) return impl_->Explain(finished);
  return response.batches_received();
}

}  // namespace recal
