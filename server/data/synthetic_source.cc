#include <exception>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/randn.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/data/sources.h"
#include "server/data/torch_error.h"

namespace recal::data {
namespace {

class SyntheticSource final : public BatchSource {
 public:
  SyntheticSource(std::vector<int64_t> batch_shape, uint64_t seed, std::string description)
      : batch_shape_(std::move(batch_shape)), seed_(seed), description_(std::move(description)) {}

  absl::StatusOr<std::optional<Batch>> Next() override {
    // A fresh generator per batch, seeded from (seed, k): batch k is reproducible alone,
    // e.g. after a job restarts part-way. Unsigned overflow is intended.
    const uint64_t batch_seed = seed_ * 1000003ULL + static_cast<uint64_t>(next_batch_);
    try {
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(batch_seed);
      Batch batch{at::randn(batch_shape_, gen, at::TensorOptions().dtype(at::kFloat))};
      ++next_batch_;
      return std::optional<Batch>(std::move(batch));
    } catch (const std::exception& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat(description_, ": cannot make batch ", next_batch_, ": ", ExceptionMessage(e)));
    }
  }

  std::optional<int64_t> num_samples() const override { return std::nullopt; }
  absl::Status SkipBatches(int64_t batches) override {
    next_batch_ += batches;
    return absl::OkStatus();
  }
  std::string Describe() const override { return description_; }

 private:
  const std::vector<int64_t> batch_shape_;
  const uint64_t seed_;
  const std::string description_;
  int64_t next_batch_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenSyntheticSource(const std::vector<int64_t>& sample_shape,
                                                                 uint64_t seed, int64_t batch_size) {
  const std::string shape = absl::StrJoin(sample_shape, "x");
  const std::string label = absl::StrCat("synthetic:", shape, ",seed=", seed);
  if (batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": batch size must be >= 1, got ", batch_size));
  }
  if (sample_shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": the per-sample shape is empty"));
  }
  std::vector<int64_t> batch_shape{batch_size};
  for (int64_t dim : sample_shape) {
    if (dim < 1) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": dimensions must be >= 1"));
    }
    batch_shape.push_back(dim);
  }
  return std::unique_ptr<BatchSource>(new SyntheticSource(
      std::move(batch_shape), seed, absl::StrCat(label, " (endless x ", shape, " float32 N(0,1))")));
}

}  // namespace recal::data
