#include "server/engine/options.h"

#include "absl/strings/str_cat.h"

namespace recal::engine {

absl::StatusOr<MemoryFormat> ParseMemoryFormat(absl::string_view name) {
  if (name == "auto") return MemoryFormat::kAuto;
  if (name == "contiguous") return MemoryFormat::kContiguous;
  if (name == "channels_last") return MemoryFormat::kChannelsLast;
  return absl::InvalidArgumentError(
      absl::StrCat("memory format '", name, "': use auto, contiguous or channels_last"));
}

const char* MemoryFormatName(MemoryFormat format) {
  switch (format) {
    case MemoryFormat::kAuto: return "auto";
    case MemoryFormat::kContiguous: return "contiguous";
    case MemoryFormat::kChannelsLast: return "channels_last";
  }
  return "unknown";
}

absl::StatusOr<ComputeDtype> ParseComputeDtype(absl::string_view name) {
  if (name == "float32") return ComputeDtype::kFloat32;
  if (name == "bfloat16") return ComputeDtype::kBFloat16;
  if (name == "float16") return ComputeDtype::kFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("compute dtype '", name, "': use float32, bfloat16 or float16"));
}

const char* ComputeDtypeName(ComputeDtype dtype) {
  switch (dtype) {
    case ComputeDtype::kFloat32: return "float32";
    case ComputeDtype::kBFloat16: return "bfloat16";
    case ComputeDtype::kFloat16: return "float16";
  }
  return "unknown";
}

}  // namespace recal::engine
