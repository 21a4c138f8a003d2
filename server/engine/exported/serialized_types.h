// The enums and scalars of torch.export's serialization schema (torch/_export/serde/
// schema.py), which number things differently from c10, turned into c10 values.
#pragma once

#include <cstdint>
#include <vector>

#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace recal::engine::exported {

inline constexpr int64_t kStridedLayout = 7;  // schema.Layout.Strided

absl::StatusOr<c10::ScalarType> ScalarTypeOf(int64_t serialized);
absl::StatusOr<c10::Layout> LayoutOf(int64_t serialized);
absl::StatusOr<c10::MemoryFormat> MemoryFormatOf(int64_t serialized);

// A list of schema SymInt ({"as_int": 3}); INVALID_ARGUMENT for a symbolic one
// ({"as_expr": ...}), which a stored weight never has.
absl::StatusOr<std::vector<int64_t>> ConcreteInts(const nlohmann::json& sym_ints);

}  // namespace recal::engine::exported
