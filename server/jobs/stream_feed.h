// Batches a client pushes (PushBatches) for a job whose data source is client_stream: a
// bounded queue between the RPC (which blocks while it is full: back-pressure) and the
// job's worker (which blocks while it is empty).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "absl/status/status.h"
#include "recal/v1/recal.pb.h"
#include "server/data/batch_source.h"
#include "server/data/normalization.h"

namespace recal::jobs {

class StreamFeed : public data::BatchSource {
 public:
  StreamFeed(v1::ClientStreamSource normalisation, int64_t max_batch_bytes, int capacity = 4);

  // Converts and queues one batch (blocks while `capacity` batches wait). `last` ends the
  // data. Fails once the feed is closed or ended, or for a malformed batch.
  absl::Status Push(const google::protobuf::RepeatedPtrField<v1::Tensor>& inputs, bool last);
  // Wakes both sides: Next() returns `reason` (cancellation, shutdown), Push() fails.
  void Close(const absl::Status& reason);

  // Next() waits no later than this for the client (DEADLINE_EXCEEDED after).
  void set_deadline(std::chrono::steady_clock::time_point deadline);

  absl::StatusOr<std::optional<data::Batch>> Next() override;
  std::optional<int64_t> num_samples() const override { return std::nullopt; }
  std::string Describe() const override { return "client stream"; }

 private:
  absl::StatusOr<at::Tensor> ToTensor(const v1::Tensor& tensor) const;

  const data::Normalization normalization_;
  const int64_t max_batch_bytes_;
  const int capacity_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<data::Batch> batches_;
  bool ended_ = false;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  absl::Status closed_;
};

}  // namespace recal::jobs
