#include "server/data/torch_dtype.h"

namespace recal::data {

c10::ScalarType ToScalarType(formats::DType dtype) {
  switch (dtype) {
    case formats::DType::kF64: return c10::ScalarType::Double;
    case formats::DType::kF32: return c10::ScalarType::Float;
    case formats::DType::kF16: return c10::ScalarType::Half;
    case formats::DType::kBF16: return c10::ScalarType::BFloat16;
    case formats::DType::kI64: return c10::ScalarType::Long;
    case formats::DType::kI32: return c10::ScalarType::Int;
    case formats::DType::kI16: return c10::ScalarType::Short;
    case formats::DType::kI8: return c10::ScalarType::Char;
    case formats::DType::kU8: return c10::ScalarType::Byte;
    case formats::DType::kBool: return c10::ScalarType::Bool;
  }
  return c10::ScalarType::Undefined;
}

std::string ScalarTypeName(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Bool: return "bool";
    default: return c10::toString(type);
  }
}

}  // namespace recal::data
