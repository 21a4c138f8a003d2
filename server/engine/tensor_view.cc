#include "server/engine/tensor_view.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recal::engine {

std::optional<ViewExtent> ExtentOf(const TensorView& view) {
  if (view.storage_offset < 0 || view.sizes.size() != view.strides.size()) return std::nullopt;
  int64_t numel = 1, last = view.storage_offset;
  for (size_t i = 0; i < view.sizes.size(); ++i) {
    if (view.sizes[i] < 0 || view.strides[i] < 0) return std::nullopt;
    if (__builtin_mul_overflow(numel, view.sizes[i], &numel)) return std::nullopt;
    int64_t span;
    if (view.sizes[i] > 0 && (__builtin_mul_overflow(view.sizes[i] - 1, view.strides[i], &span) ||
                              __builtin_add_overflow(last, span, &last))) {
      return std::nullopt;
    }
  }
  return ViewExtent{numel, numel == 0 ? 0 : last + 1};
}

absl::Status CheckViewFits(absl::string_view tensor, const TensorView& view, int64_t storage_bytes,
                           absl::string_view storage) {
  const std::string described =
      absl::StrCat("tensor '", tensor, "' (", c10::toString(view.dtype), ", sizes [", absl::StrJoin(view.sizes, ", "),
                   "], strides [", absl::StrJoin(view.strides, ", "), "], storage offset ", view.storage_offset, ")");
  const std::optional<ViewExtent> extent = ExtentOf(view);
  if (!extent) {
    return absl::InvalidArgumentError(
        absl::StrCat(described, " has an impossible shape (negative or overflowing): the archive is damaged "
                                "or crafted; save the model again"));
  }
  const int64_t element = static_cast<int64_t>(c10::elementSize(view.dtype));
  int64_t reach_bytes;
  if (__builtin_mul_overflow(extent->reach, element, &reach_bytes) || reach_bytes > storage_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        described, " reaches ", extent->reach, " elements (", extent->reach, " x ", element,
        " bytes) into its storage ", storage, ", which holds ", storage_bytes,
        " bytes: the archive is damaged or crafted; save the model again"));
  }
  return absl::OkStatus();
}

}  // namespace recal::engine
