// The sizes torch.export writes for dynamic dimensions: sympy's srepr of an expression in
// the program's symbols, e.g. "Symbol('s0', positive=True, integer=True)" for a
// torch.export.Dim, "Add(Mul(Integer(2), Symbol('s1', ...)), Integer(1))" for 2*d + 1.
// Only what a derived Dim can be is read: an integer-linear expression of one symbol. No
// LibTorch and no sympy: the program comes from an upload, so the text is bounded and
// anything else (FloorDiv, Pow, two symbols) is refused, for the caller to leave unchecked.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal {

// coefficient * symbol + offset; without a symbol, the constant `offset`.
struct LinearSize {
  std::string symbol;  // "" for a constant
  int64_t coefficient = 0;
  int64_t offset = 0;

  bool operator==(const LinearSize& other) const {
    return symbol == other.symbol && coefficient == other.coefficient && offset == other.offset;
  }
};

// At most this many characters, nested at most kMaxSizeExpressionDepth calls deep.
inline constexpr size_t kMaxSizeExpressionLength = 4096;
inline constexpr int kMaxSizeExpressionDepth = 32;

// The linear size `srepr` spells with Symbol, Integer, Add and Mul. INVALID_ARGUMENT, naming
// what was not understood, for any other function, a product of two symbols, a sum of two
// different symbols, a coefficient of 0 or beyond int64, or text past the bounds above.
absl::StatusOr<LinearSize> ParseSizeExpression(absl::string_view srepr);

}  // namespace recal
