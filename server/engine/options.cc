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

}  // namespace recal::engine
