// PushBatches: one client stream of batches, ended by a message marked last.
#include "client/src/client_impl.h"

namespace recal {

absl::StatusOr<int64_t> Client::PushBatches(const std::string& job_id, const BatchProducer& next, int shard) {
  grpc::ClientContext context;
  impl_->Prepare(&context, /*unary=*/false);
  v1::PushBatchesResponse response;
  auto writer = impl_->stub->PushBatches(&context, &response);
  std::vector<v1::Tensor> inputs;
  while (true) {
    absl::StatusOr<bool> more = next(&inputs);
    if (!more.ok()) {
      context.TryCancel();
      writer->Finish();
      return more.status();
    }
    v1::PushBatchesRequest message;
    message.set_job_id(job_id);
    message.set_shard(shard);
    if (!*more) {
      message.set_last(true);
      writer->Write(message);
      break;
    }
    for (v1::Tensor& tensor : inputs) *message.add_inputs() = std::move(tensor);
    // The server blocks while the job's queue is full (back-pressure); a failed Write
    // means it has ended the call, and Finish says why.
    if (!writer->Write(message)) break;
  }
  writer->WritesDone();
  const absl::Status finished = FromGrpcStatus(writer->Finish());
  if (!finished.ok()) return impl_->Explain(finished);
  return response.batches_received();
}

}  // namespace recal
