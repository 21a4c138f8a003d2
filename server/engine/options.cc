#include "server/engine/options.h"

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"

namespace recal::engine {

// The engine keeps enums of its own (used in switches throughout the forward); their names
// are the proto's (v1::MemoryFormat, v1::ComputeDtype), mapped here and nowhere else.

MemoryFormat MemoryFormatOf(v1::MemoryFormat format) {
  switch (format) {
    case v1::CONTIGUOUS: return MemoryFormat::kContiguous;
    case v1::CHANNELS_LAST: return MemoryFormat::kChannelsLast;
    default: return MemoryFormat::kAuto;
  }
}

absl::StatusOr<MemoryFormat> ParseMemoryFormat(absl::string_view name) {
  if (std::optional<v1::MemoryFormat> format = EnumFromName<v1::MemoryFormat>(name)) return MemoryFormatOf(*format);
  return absl::InvalidArgumentError(
      absl::StrCat("memory format '", name, "': use ", EnumNameList<v1::MemoryFormat>()));
}

std::string MemoryFormatName(MemoryFormat format) {
  switch (format) {
    case MemoryFormat::kAuto: return EnumName(v1::AUTO);
    case MemoryFormat::kContiguous: return EnumName(v1::CONTIGUOUS);
    case MemoryFormat::kChannelsLast: return EnumName(v1::CHANNELS_LAST);
  }
  return "unknown";
}

ComputeDtype ComputeDtypeOf(v1::ComputeDtype dtype) {
  switch (dtype) {
    case v1::BFLOAT16: return ComputeDtype::kBFloat16;
    case v1::FLOAT16: return ComputeDtype::kFloat16;
    default: return ComputeDtype::kFloat32;
  }
}

absl::StatusOr<ComputeDtype> ParseComputeDtype(absl::string_view name) {
  if (std::optional<v1::ComputeDtype> dtype = EnumFromName<v1::ComputeDtype>(name)) return ComputeDtypeOf(*dtype);
  return absl::InvalidArgumentError(
      absl::StrCat("compute dtype '", name, "': use ", EnumNameList<v1::ComputeDtype>()));
}

std::string ComputeDtypeName(ComputeDtype dtype) {
  switch (dtype) {
    case ComputeDtype::kFloat32: return EnumName(v1::FLOAT32);
    case ComputeDtype::kBFloat16: return EnumName(v1::BFLOAT16);
    case ComputeDtype::kFloat16: return EnumName(v1::FLOAT16);
  }
  return "unknown";
}

int64_t ProgressTickBatches(const Options& options, bool on_cpu) {
  if (options.progress_tick_batches > 0) return options.progress_tick_batches;
  return on_cpu ? 1 : kGpuProgressTickBatches;
}

}  // namespace recal::engine
