#include "server/jobs/stream_feed.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recal::jobs {

StreamFeed::StreamFeed(v1::ClientStreamSource normalisation, int64_t max_batch_bytes, int capacity)
    : normalization_{normalisation.scale(),
                     {normalisation.mean().begin(), normalisation.mean().end()},
                     {normalisation.std().begin(), normalisation.std().end()}},
      max_batch_bytes_(max_batch_bytes),
      capacity_(capacity) {}

absl::StatusOr<at::Tensor> StreamFeed::ToTensor(const v1::Tensor& tensor) const {
  at::ScalarType type;
  switch (tensor.dtype()) {
    case v1::Tensor::FLOAT32: type = at::kFloat; break;
    case v1::Tensor::FLOAT16: type = at::kHalf; break;
    case v1::Tensor::UINT8: type = at::kByte; break;
    default: return absl::InvalidArgumentError("tensor dtype must be FLOAT32, FLOAT16 or UINT8");
  }
  if (tensor.shape().empty()) return absl::InvalidArgumentError("a tensor needs a batch dimension");
  int64_t numel = 1;
  for (int64_t d : tensor.shape()) {
    if (d <= 0) return absl::InvalidArgumentError("tensor dims must be positive");
    numel *= d;
    if (numel > max_batch_bytes_) break;
  }
  const int64_t bytes = numel * static_cast<int64_t>(at::elementSize(type));
  if (bytes > max_batch_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("a pushed tensor of shape [", absl::StrJoin(tensor.shape(), ","),
                                                     "] exceeds the server's batch limit of ",
                                                     max_batch_bytes_, " bytes (--max_batch_bytes)"));
  }
  if (static_cast<int64_t>(tensor.data().size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor of shape [", absl::StrJoin(tensor.shape(), ","),
                                                   "] needs ", bytes, " bytes of data, got ",
                                                   tensor.data().size()));
  }
  std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
  // A copy even for float32 without normalisation: the message goes away.
  const at::Tensor x = at::from_blob(const_cast<char*>(tensor.data().data()), shape, at::TensorOptions(type));
  absl::StatusOr<at::Tensor> converted = data::ToModelInput(x, normalization_);
  if (!converted.ok()) {
    return absl::Status(converted.status().code(), absl::StrCat("client_stream: ", converted.status().message()));
  }
  return converted->data_ptr() == x.data_ptr() ? converted->clone() : *std::move(converted);
}

absl::Status StreamFeed::Push(const google::protobuf::RepeatedPtrField<v1::Tensor>& inputs, bool last) {
  data::Batch batch;
  for (const v1::Tensor& input : inputs) {
    auto tensor = ToTensor(input);
    if (!tensor.ok()) return tensor.status();
    if (!batch.empty() && tensor->size(0) != batch[0].size(0)) {
      return absl::InvalidArgumentError("the inputs of a batch must share dim 0");
    }
    batch.push_back(*std::move(tensor));
  }
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !closed_.ok() || ended_ || static_cast<int>(batches_.size()) < capacity_; });
  if (!closed_.ok()) return closed_;
  if (ended_) return absl::FailedPreconditionError("the job's data has ended (a batch was marked last)");
  if (!batch.empty()) batches_.push_back(std::move(batch));
  ended_ = last;
  changed_.notify_all();
  return absl::OkStatus();
}

void StreamFeed::Close(const absl::Status& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_.ok()) closed_ = reason;
  changed_.notify_all();
}

void StreamFeed::set_deadline(std::chrono::steady_clock::time_point deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  deadline_ = deadline;
  changed_.notify_all();
}

absl::StatusOr<std::optional<data::Batch>> StreamFeed::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto ready = [&] { return !closed_.ok() || ended_ || !batches_.empty(); };
  while (!ready()) {
    if (changed_.wait_until(lock, deadline_) == std::cv_status::timeout && !ready()) {
      return absl::DeadlineExceededError("the job ran past its timeout waiting for pushed batches");
    }
  }
  if (!closed_.ok()) return closed_;
  if (!batches_.empty()) {
    data::Batch batch = std::move(batches_.front());
    batches_.pop_front();
    changed_.notify_all();
    return std::optional<data::Batch>(std::move(batch));
  }
  return std::optional<data::Batch>();
}

}  // namespace recal::jobs
