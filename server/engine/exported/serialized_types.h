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

// The integer a schema field holds (a dtype code, {"as_int": 3}). Throws what get<int64_t>()
// throws for a string or a boolean (nlohmann::json::type_error), and the same where
// get<int64_t>() would convert instead: a float (1.5, or 1e30, which past int64's range is
// undefined behaviour) or an unsigned number past int64. The readers of the program's JSON
// catch json::exception and refuse the program.
int64_t SchemaInt(const nlohmann::json& value);

// A list of schema SymInt ({"as_int": 3}); INVALID_ARGUMENT for a symbolic one
// ({"as_expr": ...}), which a stored weight never has.
absl::StatusOr<std::vector<int64_t>> ConcreteInts(const nlohmann::json& sym_ints);

}  // namespace recal::engine::exported
