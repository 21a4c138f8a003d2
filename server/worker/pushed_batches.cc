#include "server/worker/pushed_batches.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "recal/worker/v1/worker.pb.h"

namespace recal::worker {
namespace {

namespace wire = ::recal::worker::v1;

absl::StatusOr<at::Tensor> ToTensor(const ::recal::v1::Tensor& tensor) {
  at::ScalarType type;
  switch (tensor.dtype()) {
    case ::recal::v1::Tensor::FLOAT32: type = at::kFloat; break;
    case ::recal::v1::Tensor::FLOAT16: type = at::kHalf; break;
    case ::recal::v1::Tensor::UINT8: type = at::kByte; break;
    default: return absl::InvalidArgumentError("tensor dtype must be FLOAT32, FLOAT16 or UINT8");
  }
  std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;  // the server checked every dim and the byte count
  if (shape.empty() || numel * static_cast<int64_t>(at::elementSize(type)) !=
                           static_cast<int64_t>(tensor.data().size())) {
    return absl::InvalidArgumentError("a pushed tensor's data does not match its shape");
  }
  return at::from_blob(const_cast<char*>(tensor.data().data()), shape, at::TensorOptions(type)).clone();
}

class PushedSource : public data::BatchSource {
 public:
  explicit PushedSource(MessageReader* reader) : reader_(reader) {}

  absl::StatusOr<std::optional<data::Batch>> Next() override {
    while (!ended_) {
      wire::PushedBatch pushed;
      absl::StatusOr<bool> read = reader_->Read(&pushed);
      if (!read.ok()) return read.status();
      if (!*read) return absl::UnavailableError("the server stopped relaying pushed batches");
      ended_ = pushed.last();
      if (pushed.inputs().empty()) continue;
      data::Batch batch;
      for (const ::recal::v1::Tensor& input : pushed.inputs()) {
        auto tensor = ToTensor(input);
        if (!tensor.ok()) return tensor.status();
        batch.push_back(*std::move(tensor));
      }
      return std::optional<data::Batch>(std::move(batch));
    }
    return std::optional<data::Batch>();
  }
  std::optional<int64_t> num_samples() const override { return std::nullopt; }
  std::string Describe() const override { return "client stream"; }

 private:
  MessageReader* reader_;
  bool ended_ = false;
};

class PinnedSource : public data::BatchSource {
 public:
  explicit PinnedSource(std::unique_ptr<data::BatchSource> inner) : inner_(std::move(inner)) {}

  absl::StatusOr<std::optional<data::Batch>> Next() override {
    auto batch = inner_->Next();
    if (batch.ok() && batch->has_value()) {
      for (at::Tensor& t : **batch) t = t.pin_memory();
    }
    return batch;
  }
  std::optional<int64_t> num_samples() const override { return inner_->num_samples(); }
  std::string Describe() const override { return inner_->Describe(); }

 private:
  const std::unique_ptr<data::BatchSource> inner_;
};

}  // namespace

std::unique_ptr<data::BatchSource> Pinned(std::unique_ptr<data::BatchSource> inner) {
  return std::make_unique<PinnedSource>(std::move(inner));
}

std::unique_ptr<data::BatchSource> PushedBatches(MessageReader* reader) {
  return std::make_unique<PushedSource>(reader);
}

}  // namespace recal::worker
