#include "server/data/sliced_source.h"

#include <algorithm>
#include <exception>
#include <utility>

#include <ATen/ops/empty.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/formats/dtype.h"
#include "server/data/torch_dtype.h"
#include "server/data/torch_error.h"

namespace recal::data {
namespace {

class SlicedSource final : public BatchSource {
 public:
  // `ranged` null: the inputs are tensors in memory, narrowed and copied. Else they are meta
  // tensors at NamedInput::offset in `ranged`, whose rows are read.
  SlicedSource(std::string label, std::string description, std::vector<NamedInput> inputs,
               std::shared_ptr<const void> backing, std::shared_ptr<const RandomAccessFile> ranged,
               int64_t num_samples, int64_t batch_size)
      : label_(std::move(label)),
        description_(std::move(description)),
        inputs_(std::move(inputs)),
        backing_(std::move(backing)),
        ranged_(std::move(ranged)),
        num_samples_(num_samples),
        batch_size_(batch_size) {}

  absl::StatusOr<std::optional<Batch>> Next() override {
    if (cursor_ >= num_samples_) return std::optional<Batch>();
    const int64_t n = std::min(batch_size_, num_samples_ - cursor_);
    Batch batch;
    batch.reserve(inputs_.size());
    try {
      for (const NamedInput& input : inputs_) {
        if (ranged_ == nullptr) {
          batch.push_back(input.tensor.narrow(0, cursor_, n).clone(at::MemoryFormat::Contiguous));
          continue;
        }
        std::vector<int64_t> shape = input.tensor.sizes().vec();
        shape[0] = n;
        at::Tensor rows = at::empty(shape, at::TensorOptions().dtype(input.tensor.scalar_type()));
        // Row sizes come from a header the parser checked against the file's size: no overflow.
        const int64_t row_bytes = rows.numel() / n * static_cast<int64_t>(rows.element_size());
        absl::Status read = ranged_->ReadAt(input.offset + cursor_ * row_bytes,
                                            absl::MakeSpan(static_cast<char*>(rows.data_ptr()),
                                                           static_cast<size_t>(n * row_bytes)));
        if (!read.ok()) {
          return absl::Status(read.code(), absl::StrCat(label_, ": samples [", cursor_, ", ", cursor_ + n,
                                                        ") of ", input.name, ": ", read.message()));
        }
        batch.push_back(std::move(rows));
      }
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(label_, ": cannot copy samples [", cursor_, ", ",
                                              cursor_ + n, "): ", ExceptionMessage(e)));
    }
    cursor_ += n;
    return std::optional<Batch>(std::move(batch));
  }

  std::optional<int64_t> num_samples() const override { return num_samples_; }
  std::string Describe() const override { return description_; }
  absl::Status SkipBatches(int64_t batches) override {
    cursor_ = std::min(num_samples_, cursor_ + batches * batch_size_);
    return absl::OkStatus();
  }

 private:
  const std::string label_;
  const std::string description_;
  const std::vector<NamedInput> inputs_;
  const std::shared_ptr<const void> backing_;
  const std::shared_ptr<const RandomAccessFile> ranged_;
  const int64_t num_samples_;
  const int64_t batch_size_;
  int64_t cursor_ = 0;
};

std::string PerSample(const at::Tensor& t) {
  const auto sizes = t.sizes();
  return absl::StrCat(
      formats::ShapeToString(std::vector<int64_t>(sizes.begin() + 1, sizes.end())), " ",
      ScalarTypeName(t.scalar_type()));
}

}  // namespace

namespace {

absl::StatusOr<std::unique_ptr<BatchSource>> Make(std::string label, std::vector<NamedInput> inputs,
                                                  std::shared_ptr<const void> backing,
                                                  std::shared_ptr<const RandomAccessFile> ranged, int64_t batch_size) {
  if (batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": batch size must be >= 1, got ", batch_size));
  }
  if (inputs.empty()) return absl::InvalidArgumentError(absl::StrCat(label, ": holds no tensors"));
  for (const NamedInput& input : inputs) {
    if (input.tensor.dim() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": ", input.name, " is a 0-d tensor (a single number); inputs need a leading batch dimension"));
    }
  }
  const int64_t n = inputs[0].tensor.size(0);
  for (const NamedInput& input : inputs) {
    if (input.tensor.size(0) != n) {
      std::vector<std::string> dims;
      for (const NamedInput& i : inputs) dims.push_back(absl::StrCat(i.name, " has ", i.tensor.size(0)));
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": inputs must share dim 0 (the sample count), but ", absl::StrJoin(dims, ", ")));
    }
  }
  std::vector<std::string> parts;
  for (const NamedInput& input : inputs) parts.push_back(PerSample(input.tensor));
  std::string description = absl::StrCat(label, " (", n, " x ", absl::StrJoin(parts, ", "), ")");
  return std::unique_ptr<BatchSource>(new SlicedSource(std::move(label), std::move(description),
                                                       std::move(inputs), std::move(backing), std::move(ranged),
                                                       n, batch_size));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> MakeSlicedSource(std::string label, std::vector<NamedInput> inputs,
                                                              std::shared_ptr<const void> backing,
                                                              int64_t batch_size) {
  return Make(std::move(label), std::move(inputs), std::move(backing), nullptr, batch_size);
}

absl::StatusOr<std::unique_ptr<BatchSource>> MakeRangedSource(std::string label, std::vector<NamedInput> inputs,
                                                              std::shared_ptr<const RandomAccessFile> file,
                                                              int64_t batch_size) {
  if (file == nullptr) return absl::InternalError(absl::StrCat(label, ": no file to read"));
  return Make(std::move(label), std::move(inputs), nullptr, std::move(file), batch_size);
}

}  // namespace recal::data
