#include "server/jobs/stream_feed.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/status_macros.h"

namespace recal::jobs {

StreamFeed::StreamFeed(v1::ClientStreamSource normalisation, int64_t max_batch_bytes, int capacity)
    : normalisation_(std::move(normalisation)), max_batch_bytes_(max_batch_bytes), capacity_(capacity) {}

absl::StatusOr<int64_t> PushedTensorBytes(const v1::Tensor& tensor, int64_t max_batch_bytes) {
  int64_t element_bytes;
  switch (tensor.dtype()) {
    case v1::Tensor::FLOAT32: element_bytes = 4; break;
    case v1::Tensor::FLOAT16: element_bytes = 2; break;
    case v1::Tensor::UINT8: element_bytes = 1; break;
    default: return absl::InvalidArgumentError("tensor dtype must be FLOAT32, FLOAT16 or UINT8");
  }
  if (tensor.shape().empty()) return absl::InvalidArgumentError("a tensor needs a batch dimension");
  int64_t numel = 1;
  for (int64_t d : tensor.shape()) {
    if (d <= 0) return absl::InvalidArgumentError("tensor dims must be positive");
    // Compared before multiplying: a hostile shape's product overflows int64.
    if (numel > max_batch_bytes / element_bytes / d) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a pushed tensor of shape [", absl::StrJoin(tensor.shape(), ","), "] exceeds the server's batch limit of ",
          max_batch_bytes, " bytes (--max_batch_bytes): push smaller batches, or uint8/float16 inputs"));
    }
    numel *= d;
  }
  return numel * element_bytes;
}

absl::Status StreamFeed::Check(const v1::Tensor& tensor) const {
  RECAL_ASSIGN_OR_RETURN(const int64_t bytes, PushedTensorBytes(tensor, max_batch_bytes_));
  if (static_cast<int64_t>(tensor.data().size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor of shape [", absl::StrJoin(tensor.shape(), ","),
                                                   "] needs ", bytes, " bytes of data, got ",
                                                   tensor.data().size()));
  }
  // Normalisation is per channel (dim 1); the worker applies it (data::ToModelInput).
  if (!normalisation_.mean().empty() || !normalisation_.std().empty()) {
    const int64_t channels = tensor.shape_size() > 1 ? tensor.shape(1) : 0;
    if (normalisation_.mean_size() != channels || normalisation_.std_size() != channels) {
      return absl::InvalidArgumentError(absl::StrCat(
          "client_stream: mean/std have ", normalisation_.mean_size(), "/", normalisation_.std_size(),
          " values for an input with ", channels, " channels (dim 1)"));
    }
  }
  return absl::OkStatus();
}

absl::Status StreamFeed::Push(google::protobuf::RepeatedPtrField<v1::Tensor>& inputs, bool last) {
  // A message without inputs only names the job (or ends the data, when last): no batch.
  if (inputs.empty() && !last) return absl::OkStatus();
  worker::v1::PushedBatch batch;
  int64_t batch_bytes = 0;
  for (const v1::Tensor& input : inputs) {
    RECAL_RETURN_IF_ERROR(Check(input));
    if (!batch.inputs().empty() && input.shape(0) != batch.inputs(0).shape(0)) {
      return absl::InvalidArgumentError("the inputs of a batch must share dim 0");
    }
    batch_bytes += static_cast<int64_t>(input.data().size());
    if (batch_bytes > max_batch_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat("a pushed batch exceeds the server's batch limit of ",
                                                       max_batch_bytes_, " bytes in all its inputs (--max_batch_bytes)"));
    }
  }
  batch.mutable_inputs()->Swap(&inputs);
  batch.set_last(last);
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !closed_.ok() || ended_ || static_cast<int>(batches_.size()) < capacity_; });
  if (!closed_.ok()) return closed_;
  if (ended_) return absl::FailedPreconditionError("the job's data has ended (a batch was marked last)");
  batches_.push_back(std::move(batch));
  last_push_ = std::chrono::steady_clock::now();
  ended_ = last;
  changed_.notify_all();
  return absl::OkStatus();
}

void StreamFeed::Close(const absl::Status& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_.ok()) closed_ = reason;
  changed_.notify_all();
}

void StreamFeed::set_deadline(std::chrono::steady_clock::time_point deadline,
                              std::chrono::steady_clock::duration idle, const std::string& idle_flag) {
  std::lock_guard<std::mutex> lock(mu_);
  deadline_ = deadline;
  idle_ = idle;
  idle_flag_ = idle_flag;
  last_push_ = std::chrono::steady_clock::now();
  changed_.notify_all();
}

absl::StatusOr<std::optional<worker::v1::PushedBatch>> StreamFeed::Next() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto ready = [&] { return !closed_.ok() || !batches_.empty() || (ended_ && delivered_last_); };
  while (!ready()) {
    const auto idle_end =
        idle_ < deadline_ - last_push_ ? last_push_ + idle_ : std::chrono::steady_clock::time_point::max();
    if (changed_.wait_until(lock, std::min(deadline_, idle_end)) == std::cv_status::no_timeout || ready()) {
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline_) return absl::DeadlineExceededError("the job ran past its timeout waiting for pushed batches");
    if (now >= idle_end) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no batch was pushed for ", absl::FormatDuration(absl::FromChrono(idle_)),
          ": the job gave its worker back. Push the batches without pausing that long, or ask the operator to "
          "raise ", idle_flag_));
    }
  }
  if (!closed_.ok()) return closed_;
  if (batches_.empty()) return std::optional<worker::v1::PushedBatch>();
  worker::v1::PushedBatch batch = std::move(batches_.front());
  batches_.pop_front();
  delivered_last_ = batch.last();
  changed_.notify_all();
  return std::optional<worker::v1::PushedBatch>(std::move(batch));
}

std::shared_ptr<StreamFeed> StreamFeeds::Open(const v1::Job& job) {
  std::shared_ptr<StreamFeed> opened;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<StreamFeed>& feed = feeds_[job.id()];
    if (!feed) feed = std::make_shared<StreamFeed>(job.spec().data().client_stream(), max_batch_bytes_);
    opened = feed;
  }
  opened_.notify_all();
  return opened;
}

std::shared_ptr<StreamFeed> StreamFeeds::Await(const std::string& job_id, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<StreamFeed> found;
  opened_.wait_for(lock, timeout, [&] {
    auto feed = feeds_.find(job_id);
    if (feed != feeds_.end()) found = feed->second;
    return found != nullptr;
  });
  return found;
}

std::shared_ptr<StreamFeed> StreamFeeds::Find(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto feed = feeds_.find(job_id);
  return feed == feeds_.end() ? nullptr : feed->second;
}

void StreamFeeds::Close(const std::string& job_id, const absl::Status& reason) {
  std::shared_ptr<StreamFeed> feed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = feeds_.find(job_id);
    if (found == feeds_.end()) return;
    feed = std::move(found->second);
    feeds_.erase(found);
  }
  feed->Close(reason);
}

void StreamFeeds::CloseAll(const absl::Status& reason) {
  std::map<std::string, std::shared_ptr<StreamFeed>> feeds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    feeds.swap(feeds_);
  }
  for (auto& [id, feed] : feeds) feed->Close(reason);
}

}  // namespace recal::jobs
