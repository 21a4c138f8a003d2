#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data_spec.h"
#include "common/status_macros.h"
#include "server/data/batch_source.h"
#include "server/data/image_source.h"
#include "server/data/normalization.h"
#include "server/data/prefetcher.h"
#include "server/data/s3_sources.h"
#include "server/data/sources.h"
#include "server/data_access/locate_objects.h"

namespace recal::data {
namespace {

absl::StatusOr<std::unique_ptr<BatchSource>> OpenSource(const DataSpec& parsed, int64_t batch_size,
                                                        const InputOptions& options) {
  if (ReadsObjectStorage(parsed)) return OpenS3Source(parsed, batch_size, options);
  switch (parsed.scheme) {
    case DataSpec::Scheme::kNpy:
      return OpenNpySource(parsed.path, batch_size);
    case DataSpec::Scheme::kSafetensors:
      return OpenSafetensorsSource(parsed.path, parsed.keys, batch_size);
    case DataSpec::Scheme::kTorch:
      return OpenTorchSource(parsed.path, batch_size);
    case DataSpec::Scheme::kSynthetic:
      return OpenSyntheticSource(parsed.sample_shape, parsed.seed, batch_size);
    case DataSpec::Scheme::kImages:
      return OpenImageSource(parsed, batch_size,
                             {.threads = options.decode_threads, .allowed_roots = options.access.data_roots});
  }
  return absl::InternalError(absl::StrCat("unhandled data spec scheme in '", DataSpecToString(parsed), "'"));
}

// The first `count` batches of `inner`.
class Limited final : public BatchSource {
 public:
  Limited(std::unique_ptr<BatchSource> inner, int64_t count) : inner_(std::move(inner)), left_(count) {}
  absl::StatusOr<std::optional<Batch>> Next() override {
    if (left_ <= 0) return std::optional<Batch>();
    auto batch = inner_->Next();
    if (batch.ok() && batch->has_value()) --left_;
    return batch;
  }
  std::optional<int64_t> num_samples() const override { return inner_->num_samples(); }
  std::string Describe() const override { return inner_->Describe(); }
  int64_t skipped_files() const override { return inner_->skipped_files(); }

 private:
  std::unique_ptr<BatchSource> inner_;
  int64_t left_;
};

absl::StatusOr<std::unique_ptr<BatchSource>> OpenChecked(const DataSpec& spec, int64_t batch_size,
                                                         const InputOptions& options) {
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size must be >= 1, got ", batch_size, " (data spec '", DataSpecToString(spec), "')"));
  }
  return OpenSource(spec, batch_size, options);
}

// The conversions and the read-ahead around an opened source.
std::unique_ptr<BatchSource> Pipeline(const DataSpec& parsed, std::unique_ptr<BatchSource> source,
                                      const InputOptions& options) {
  const bool files = parsed.scheme == DataSpec::Scheme::kNpy || parsed.scheme == DataSpec::Scheme::kSafetensors ||
                     parsed.scheme == DataSpec::Scheme::kTorch;
  if (files) source = Normalized(std::move(source), {parsed.scale, parsed.mean, parsed.std});
  if (options.prefetch_depth > 0 || options.pin_memory) {
    source = Prefetched(std::move(source), options.prefetch_depth, options.pin_memory);
  }
  return source;
}

}  // namespace

absl::Status BatchSource::SkipBatches(int64_t batches) {
  for (int64_t i = 0; i < batches; ++i) {
    auto batch = Next();
    if (!batch.ok()) return batch.status();
    if (!batch->has_value()) break;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BatchSource>> OpenBatchSource(const DataSpec& spec, int64_t batch_size,
                                                             const InputOptions& options) {
  RECAL_ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source, OpenChecked(spec, batch_size, options));
  return Pipeline(spec, std::move(source), options);
}

absl::StatusOr<std::unique_ptr<BatchSource>> OpenBatchSource(const std::string& spec, int64_t batch_size,
                                                             const InputOptions& options) {
  RECAL_ASSIGN_OR_RETURN(const DataSpec parsed, ParseDataSpec(spec));
  return OpenBatchSource(parsed, batch_size, options);
}

absl::StatusOr<BatchRange> ShardBatchRange(std::optional<int64_t> num_samples, int64_t batch_size,
                                           const ShardPlan& plan) {
  if (plan.count < 1 || plan.index < 0 || plan.index >= plan.count) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", plan.index, " of ", plan.count, " does not exist"));
  }
  const int64_t limit = plan.max_batches > 0 ? plan.max_batches : plan.default_batches;
  int64_t total = limit;
  if (num_samples) {
    const int64_t available = (*num_samples + batch_size - 1) / batch_size;
    if (plan.max_batches > 0 && available < plan.max_batches && !plan.allow_short_data) {
      return ShortDataError(available, *num_samples, plan.max_batches);
    }
    total = std::min(available, limit);
  }
  if (total == 0) return absl::InvalidArgumentError("the data has no samples");
  if (total < plan.count) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job uses ", total, " batches, fewer than its ", plan.count, " shards; use fewer shards"));
  }
  // In 128 bits: max_batches comes from the job spec, and total * index must not overflow.
  auto boundary = [&](int k) { return static_cast<int64_t>(static_cast<__int128>(total) * k / plan.count); };
  return BatchRange{boundary(plan.index), boundary(plan.index + 1) - boundary(plan.index)};
}

absl::StatusOr<ShardOfData> OpenBatchSourceShard(const DataSpec& spec, int64_t batch_size,
                                                 const InputOptions& options, const ShardPlan& plan) {
  RECAL_ASSIGN_OR_RETURN(std::unique_ptr<BatchSource> source, OpenChecked(spec, batch_size, options));
  auto range = ShardBatchRange(source->num_samples(), batch_size, plan);
  if (!range.ok()) return absl::Status(range.status().code(), absl::StrCat(source->Describe(), ": ", range.status().message()));
  if (absl::Status skipped = source->SkipBatches(range->first); !skipped.ok()) return skipped;
  std::unique_ptr<BatchSource> shard = std::make_unique<Limited>(std::move(source), range->count);
  return ShardOfData{Pipeline(spec, std::move(shard), options), *range};
}

absl::StatusOr<ShardOfData> OpenBatchSourceShard(const std::string& spec, int64_t batch_size,
                                                 const InputOptions& options, const ShardPlan& plan) {
  RECAL_ASSIGN_OR_RETURN(const DataSpec parsed, ParseDataSpec(spec));
  return OpenBatchSourceShard(parsed, batch_size, options, plan);
}

}  // namespace recal::data
