#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data_spec.h"
#include "server/data/batch_source.h"
#include "server/data/image_source.h"
#include "server/data/normalization.h"
#include "server/data/prefetcher.h"
#include "server/data/sources.h"

namespace recal::data {
namespace {

absl::StatusOr<std::unique_ptr<BatchSource>> OpenSource(const DataSpec& parsed, int64_t batch_size,
                                                        const InputOptions& options) {
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
                             {.threads = options.decode_threads, .allowed_roots = options.data_roots});
  }
  return absl::InternalError(absl::StrCat("unhandled data spec scheme in '", DataSpecToString(parsed), "'"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenBatchSource(const std::string& spec, int64_t batch_size,
                                                             const InputOptions& options) {
  absl::StatusOr<DataSpec> parsed = ParseDataSpec(spec);
  if (!parsed.ok()) return parsed.status();
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size must be >= 1, got ", batch_size, " (data spec '", spec, "')"));
  }
  absl::StatusOr<std::unique_ptr<BatchSource>> source = OpenSource(*parsed, batch_size, options);
  if (!source.ok()) return source;
  const bool files = parsed->scheme == DataSpec::Scheme::kNpy || parsed->scheme == DataSpec::Scheme::kSafetensors ||
                     parsed->scheme == DataSpec::Scheme::kTorch;
  if (files) *source = Normalized(*std::move(source), {parsed->scale, parsed->mean, parsed->std});
  if (options.prefetch_depth > 0 || options.pin_memory) {
    *source = Prefetched(*std::move(source), options.prefetch_depth, options.pin_memory);
  }
  return source;
}

}  // namespace recal::data
