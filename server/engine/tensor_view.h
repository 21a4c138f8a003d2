// A tensor's view of its storage as an archive declares it (sizes, strides, offset), checked
// against the bytes that really hold the storage before LibTorch makes the tensor: LibTorch
// trusts what an archive says, so a crafted view would read (and a job would return) the
// process's heap. Shared by the TorchScript (script_tensors.h) and PT2 (exported/pt2_archive.h)
// readers.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <c10/core/ScalarType.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace recal::engine {

struct TensorView {
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t storage_offset = 0;  // in elements
};

struct ViewExtent {
  int64_t numel = 0;
  int64_t reach = 0;  // storage elements up to one past the last one the view reads; 0 when empty
};

// nullopt when sizes and strides differ in length, anything is negative, or a product overflows.
std::optional<ViewExtent> ExtentOf(const TensorView& view);

// OK when every element of `view` lies in the first `storage_bytes` bytes of its storage; else
// INVALID_ARGUMENT naming `tensor`, the view's numbers and `storage` (the record holding it).
absl::Status CheckViewFits(absl::string_view tensor, const TensorView& view, int64_t storage_bytes,
                           absl::string_view storage);

}  // namespace recal::engine
