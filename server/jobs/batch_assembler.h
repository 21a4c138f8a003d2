// Joins a batch that a client sent in parts (PushBatchesRequest.batch_continues) back into one
// message, so that a job's feed only ever sees whole batches: a batch larger than the gRPC
// message limit is still one batch, and its statistics are those of the whole. One assembler
// per PushBatches stream, at the end that feeds the job (this process's feed, or the worker
// process's in cluster mode; relays pass the parts on as they are, each within the limit).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"

namespace recal::jobs {

class BatchAssembler {
 public:
  // A batch in parts may declare at most `max_batch_bytes` in all its inputs: what the
  // assembler may hold for one stream.
  explicit BatchAssembler(int64_t max_batch_bytes) : max_batch_bytes_(max_batch_bytes) {}

  // Takes the stream's next message. Returns the batch it completes (the message itself when
  // it came whole, which includes messages with no inputs), or nullptr while the batch goes
  // on. What it returns stays valid until the next call. Errors name the part and the rule.
  absl::StatusOr<v1::PushBatchesRequest*> Add(v1::PushBatchesRequest& message);

  // The client ended its stream: an error if it ended inside a batch.
  absl::Status Finish() const;

 private:
  absl::Status Start(v1::PushBatchesRequest& first);
  absl::Status Append(const v1::PushBatchesRequest& part);

  const int64_t max_batch_bytes_;
  bool assembling_ = false;
  int parts_ = 0;
  v1::PushBatchesRequest batch_;
  std::vector<int64_t> expected_bytes_;  // per input of batch_, from its dtype and shape
};

}  // namespace recal::jobs
