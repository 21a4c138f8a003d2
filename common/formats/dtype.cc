#include "common/formats/dtype.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recal::formats {
namespace {

struct DTypeInfo {
  DType dtype;
  int64_t size;
  absl::string_view name;
  absl::string_view safetensors_name;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, 8, "float64", "F64"},   {DType::kF32, 4, "float32", "F32"},
    {DType::kF16, 2, "float16", "F16"},   {DType::kBF16, 2, "bfloat16", "BF16"},
    {DType::kI64, 8, "int64", "I64"},     {DType::kI32, 4, "int32", "I32"},
    {DType::kI16, 2, "int16", "I16"},     {DType::kI8, 1, "int8", "I8"},
    {DType::kU8, 1, "uint8", "U8"},       {DType::kBool, 1, "bool", "BOOL"},
};

const DTypeInfo& Info(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[0];  // unreachable: every enumerator is in the table
}

}  // namespace

int64_t ElementSize(DType dtype) { return Info(dtype).size; }

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::string_view SafetensorsDTypeName(DType dtype) { return Info(dtype).safetensors_name; }

std::optional<DType> DTypeFromSafetensorsName(absl::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.safetensors_name == name) return info.dtype;
  }
  return std::nullopt;
}

std::string ShapeToString(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "scalar";
  return absl::StrJoin(shape, "x");
}

absl::StatusOr<int64_t> DenseByteSize(const std::vector<int64_t>& shape, DType dtype) {
  // The product of the non-zero dims must fit too (numpy refuses such shapes as well): a
  // zero dim makes the size 0, but a tensor's strides are products of the other dims.
  int64_t bytes = ElementSize(dtype);
  bool empty = false;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension in shape [", absl::StrJoin(shape, ", "), "]"));
    }
    if (dim == 0) {
      empty = true;
      continue;
    }
    if (bytes > std::numeric_limits<int64_t>::max() / dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape [", absl::StrJoin(shape, ", "), "] of ", DTypeName(dtype), " is too large"));
    }
    bytes *= dim;
  }
  return empty ? 0 : bytes;
}

}  // namespace recal::formats
