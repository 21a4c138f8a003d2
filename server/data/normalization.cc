#include "server/data/normalization.h"

#include <exception>
#include <optional>
#include <utility>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/data/torch_dtype.h"
#include "server/data/torch_error.h"

namespace recal::data {
namespace {

bool Converts(at::ScalarType type) {
  return type == at::kByte || type == at::kHalf || type == at::kFloat;
}

class NormalizedSource final : public BatchSource {
 public:
  NormalizedSource(std::unique_ptr<BatchSource> inner, Normalization normalization)
      : inner_(std::move(inner)), normalization_(std::move(normalization)) {}

  absl::StatusOr<std::optional<Batch>> Next() override {
    absl::StatusOr<std::optional<Batch>> batch = inner_->Next();
    if (!batch.ok() || !batch->has_value()) return batch;
    for (at::Tensor& input : **batch) {
      absl::StatusOr<at::Tensor> converted = ToModelInput(input, normalization_);
      if (!converted.ok()) {
        return absl::Status(converted.status().code(), absl::StrCat(Describe(), ": ", converted.status().message()));
      }
      input = *std::move(converted);
    }
    return batch;
  }

  std::optional<int64_t> num_samples() const override { return inner_->num_samples(); }
  std::string Describe() const override { return inner_->Describe(); }
  int64_t skipped_files() const override { return inner_->skipped_files(); }

 private:
  const std::unique_ptr<BatchSource> inner_;
  const Normalization normalization_;
};

// torch's floating dtypes by the names a contract gives them.
std::optional<c10::ScalarType> FloatingType(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "float64") return at::kDouble;
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  return std::nullopt;
}

class CastSource final : public BatchSource {
 public:
  CastSource(std::unique_ptr<BatchSource> inner, const ModelInputs& inputs,
             std::function<void(const std::string&)> note)
      : inner_(std::move(inner)), inputs_(inputs), note_(std::move(note)) {
    for (const v1::ModelInput& input : inputs_) dtypes_.push_back(FloatingType(input.dtype()));
  }

  absl::StatusOr<std::optional<Batch>> Next() override {
    absl::StatusOr<std::optional<Batch>> batch = inner_->Next();
    if (!batch.ok() || !batch->has_value()) return batch;
    if (first_) Note(**batch);
    for (size_t i = 0; i < (*batch)->size() && i < dtypes_.size(); ++i) {
      at::Tensor& input = (**batch)[i];
      if (dtypes_[i] && input.is_floating_point() && input.scalar_type() != *dtypes_[i]) {
        input = input.to(*dtypes_[i]);
      }
    }
    return batch;
  }

  std::optional<int64_t> num_samples() const override { return inner_->num_samples(); }
  std::string Describe() const override { return inner_->Describe(); }
  int64_t skipped_files() const override { return inner_->skipped_files(); }

 private:
  void Note(const Batch& batch) {
    first_ = false;
    if (!note_) return;
    std::vector<TensorShape> samples;
    for (const at::Tensor& input : batch) samples.push_back({{}, ScalarTypeName(input.scalar_type())});
    for (const std::string& line : CastNotes(inputs_, samples)) note_(line);
  }

  const std::unique_ptr<BatchSource> inner_;
  const ModelInputs inputs_;
  const std::function<void(const std::string&)> note_;
  std::vector<std::optional<c10::ScalarType>> dtypes_;
  bool first_ = true;
};

}  // namespace

std::unique_ptr<BatchSource> CastToModelDtypes(std::unique_ptr<BatchSource> inner, const ModelInputs& inputs,
                                               std::function<void(const std::string&)> note) {
  return std::make_unique<CastSource>(std::move(inner), inputs, std::move(note));
}

absl::StatusOr<at::Tensor> ToModelInput(const at::Tensor& x, const Normalization& normalization) {
  if (!Converts(x.scalar_type())) return x;
  const bool normalise = !normalization.mean.empty() || !normalization.std.empty();
  if (x.scalar_type() == at::kFloat && normalization.scale <= 0 && !normalise) return x;
  const int64_t channels = x.dim() > 1 ? x.size(1) : 0;
  if (normalise && (static_cast<int64_t>(normalization.mean.size()) != channels ||
                    static_cast<int64_t>(normalization.std.size()) != channels)) {
    return absl::InvalidArgumentError(absl::StrCat("mean/std have ", normalization.mean.size(), "/",
                                                   normalization.std.size(), " values for an input with ",
                                                   channels, " channels (dim 1)"));
  }
  try {
    at::Tensor out = x.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    if (normalization.scale > 0) out.div_(normalization.scale);
    if (normalise) {
      std::vector<int64_t> view(out.dim(), 1);
      view[1] = channels;
      std::vector<float> mean(normalization.mean.begin(), normalization.mean.end());
      std::vector<float> std(normalization.std.begin(), normalization.std.end());
      out.sub_(at::tensor(mean).view(view)).div_(at::tensor(std).view(view));
    }
    return out;
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot convert an input to float32: ", ExceptionMessage(e)));
  }
}

std::unique_ptr<BatchSource> Normalized(std::unique_ptr<BatchSource> inner, Normalization normalization) {
  return std::make_unique<NormalizedSource>(std::move(inner), std::move(normalization));
}

}  // namespace recal::data
