#include "server/engine/exported/serialized_types.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace recal::engine::exported {

absl::StatusOr<c10::ScalarType> ScalarTypeOf(int64_t serialized) {
  static constexpr std::pair<int64_t, c10::ScalarType> kTypes[] = {
      {1, c10::kByte},        {2, c10::kChar},          {3, c10::kShort},         {4, c10::kInt},
      {5, c10::kLong},        {6, c10::kHalf},          {7, c10::kFloat},         {8, c10::kDouble},
      {9, c10::kComplexHalf}, {10, c10::kComplexFloat}, {11, c10::kComplexDouble}, {12, c10::kBool},
      {13, c10::kBFloat16},   {28, c10::kUInt16},       {34, c10::kUInt32},       {35, c10::kUInt64}};
  for (const auto& [code, type] : kTypes) {
    if (code == serialized) return type;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype code ", serialized, " in the program"));
}

int64_t SchemaInt(const nlohmann::json& value) {
  if (value.is_number_integer() &&
      (!value.is_number_unsigned() ||
       value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
    return value.get<int64_t>();
  }
  throw nlohmann::json::type_error::create(
      302, absl::StrCat("type must be an integer of int64's range, but is ", value.dump().substr(0, 32)), &value);
}

absl::StatusOr<c10::Layout> LayoutOf(int64_t serialized) {
  if (serialized == kStridedLayout) return c10::kStrided;
  return absl::InvalidArgumentError(
      absl::StrCat("layout code ", serialized, " in the program: only dense (strided) tensors are supported"));
}

absl::StatusOr<c10::MemoryFormat> MemoryFormatOf(int64_t serialized) {
  switch (serialized) {
    case 1: return c10::MemoryFormat::Contiguous;
    case 2: return c10::MemoryFormat::ChannelsLast;
    case 3: return c10::MemoryFormat::ChannelsLast3d;
    case 4: return c10::MemoryFormat::Preserve;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown memory format code ", serialized, " in the program"));
}

absl::StatusOr<std::vector<int64_t>> ConcreteInts(const nlohmann::json& sym_ints) {
  std::vector<int64_t> values;
  if (!sym_ints.is_array()) return absl::InvalidArgumentError("expected a list of sizes");
  for (const nlohmann::json& v : sym_ints) {
    if (!v.is_object() || !v.contains("as_int") || !v["as_int"].is_number_integer()) {
      return absl::InvalidArgumentError("a stored tensor with a symbolic size or stride");
    }
    values.push_back(v["as_int"].get<int64_t>());
  }
  return values;
}

}  // namespace recal::engine::exported
