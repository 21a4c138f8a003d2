// Element types of tensor files, shared by the .npy and .safetensors code so both name
// and size them the same way (and map to one torch dtype in server/data).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal::formats {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// Bytes per element.
int64_t ElementSize(DType dtype);

// The name people know from numpy / torch: "float32", "bfloat16", "bool", ...
absl::string_view DTypeName(DType dtype);

// Safetensors spelling: "F32", "BF16", "BOOL", ...
absl::string_view SafetensorsDTypeName(DType dtype);
std::optional<DType> DTypeFromSafetensorsName(absl::string_view name);

// The dims joined with 'x' ("3x224x224"); "scalar" for no dims.
std::string ShapeToString(const std::vector<int64_t>& shape);

// Bytes of a dense tensor of `shape` and `dtype`; an error for negative dims or a size
// that does not fit in int64 (a corrupt or hostile header, not a real file).
absl::StatusOr<int64_t> DenseByteSize(const std::vector<int64_t>& shape, DType dtype);

}  // namespace recal::formats
