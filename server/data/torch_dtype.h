// Between the file formats' dtypes and torch's.
#pragma once

#include <string>

#include <c10/core/ScalarType.h>

#include "common/formats/dtype.h"

namespace recal::data {

c10::ScalarType ToScalarType(formats::DType dtype);

// numpy-style names ("float32", "bfloat16"), matching formats::DTypeName; torch's own
// spelling for types the formats do not have.
std::string ScalarTypeName(c10::ScalarType type);

}  // namespace recal::data
