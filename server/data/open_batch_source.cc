#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data_spec.h"
#include "server/data/batch_source.h"
#include "server/data/image_source.h"
#include "server/data/sources.h"

namespace recal::data {

absl::StatusOr<std::unique_ptr<BatchSource>> OpenBatchSource(const std::string& spec,
                                                             int64_t batch_size) {
  absl::StatusOr<DataSpec> parsed = ParseDataSpec(spec);
  if (!parsed.ok()) return parsed.status();
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size must be >= 1, got ", batch_size, " (data spec '", spec, "')"));
  }
  switch (parsed->scheme) {
    case DataSpec::Scheme::kNpy:
      return OpenNpySource(parsed->path, batch_size);
    case DataSpec::Scheme::kSafetensors:
      return OpenSafetensorsSource(parsed->path, parsed->keys, batch_size);
    case DataSpec::Scheme::kTorch:
      return OpenTorchSource(parsed->path, batch_size);
    case DataSpec::Scheme::kSynthetic:
      return OpenSyntheticSource(parsed->sample_shape, parsed->seed, batch_size);
    case DataSpec::Scheme::kImages:
      return OpenImageSource(*parsed, batch_size);
  }
  return absl::InternalError(absl::StrCat("unhandled data spec scheme in '", spec, "'"));
}

}  // namespace recal::data
