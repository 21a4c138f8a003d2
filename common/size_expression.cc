#include "common/size_expression.h"

#include <cctype>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace recal {
namespace {

absl::Status Refused(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("size expression: ", why));
}

std::optional<int64_t> Add(int64_t a, int64_t b) {
  int64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

std::optional<int64_t> Multiply(int64_t a, int64_t b) {
  int64_t product;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

absl::StatusOr<LinearSize> Sum(const LinearSize& a, const LinearSize& b) {
  if (!a.symbol.empty() && !b.symbol.empty() && a.symbol != b.symbol) {
    return Refused(absl::StrCat("a sum of two symbols (", a.symbol, ", ", b.symbol, ")"));
  }
  const std::optional<int64_t> coefficient = Add(a.coefficient, b.coefficient);
  const std::optional<int64_t> offset = Add(a.offset, b.offset);
  if (!coefficient || !offset) return Refused("a number beyond int64");
  return LinearSize{a.symbol.empty() ? b.symbol : a.symbol, *coefficient, *offset};
}

absl::StatusOr<LinearSize> Product(const LinearSize& a, const LinearSize& b) {
  if (!a.symbol.empty() && !b.symbol.empty()) return Refused("a product of symbols");
  const LinearSize& scaled = a.symbol.empty() ? b : a;
  const int64_t factor = a.symbol.empty() ? a.offset : b.offset;
  const std::optional<int64_t> coefficient = Multiply(scaled.coefficient, factor);
  const std::optional<int64_t> offset = Multiply(scaled.offset, factor);
  if (!coefficient || !offset) return Refused("a number beyond int64");
  return LinearSize{scaled.symbol, *coefficient, *offset};
}

// Recursive descent over `call := NAME '(' [argument {',' argument}] ')'`, where an argument
// is a call, a quoted string (a symbol's name) or a keyword (positive=True), both only
// meaningful inside Symbol(...).
class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<LinearSize> Whole() {
    absl::StatusOr<LinearSize> value = Call(0);
    if (!value.ok()) return value;
    SkipSpaces();
    if (pos_ != text_.size()) return Refused(absl::StrCat("unexpected text at ", pos_));
    return value;
  }

 private:
  absl::StatusOr<LinearSize> Call(int depth) {
    if (depth > kMaxSizeExpressionDepth) return Refused("nested too deep");
    const std::string name = Identifier();
    if (!Consume('(')) return Refused(absl::StrCat("expected a call at ", pos_));
    if (name == "Integer") return Integer();
    if (name == "Symbol") return Symbol();
    if (name != "Add" && name != "Mul") {
      return Refused(absl::StrCat("'", name.empty() ? "?" : name, "' (only Symbol, Integer, Add and Mul are read)"));
    }
    std::vector<LinearSize> terms;
    do {
      absl::StatusOr<LinearSize> term = Call(depth + 1);
      if (!term.ok()) return term;
      terms.push_back(*std::move(term));
    } while (Consume(','));
    if (!Consume(')')) return Refused(absl::StrCat("expected ')' at ", pos_));
    return Combine(name == "Add", terms);
  }

  static absl::StatusOr<LinearSize> Combine(bool sum, const std::vector<LinearSize>& terms) {
    LinearSize result{"", 0, sum ? 0 : 1};
    for (const LinearSize& term : terms) {
      absl::StatusOr<LinearSize> next = sum ? Sum(result, term) : Product(result, term);
      if (!next.ok()) return next;
      result = *std::move(next);
    }
    return result;
  }

  absl::StatusOr<LinearSize> Integer() {
    SkipSpaces();
    const size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    while (pos_ < text_.size() && absl::ascii_isdigit(text_[pos_])) ++pos_;
    int64_t value;
    if (!absl::SimpleAtoi(text_.substr(start, pos_ - start), &value)) return Refused("a bad or too large Integer");
    if (!Consume(')')) return Refused(absl::StrCat("expected ')' at ", pos_));
    return LinearSize{"", 0, value};
  }

  absl::StatusOr<LinearSize> Symbol() {
    SkipSpaces();
    if (!Consume('\'')) return Refused("a Symbol without a quoted name");
    const size_t start = pos_;
    while (pos_ < text_.size() && (absl::ascii_isalnum(text_[pos_]) || text_[pos_] == '_')) ++pos_;
    const std::string name(text_.substr(start, pos_ - start));
    if (name.empty() || !Consume('\'')) return Refused("a Symbol whose name is not an identifier");
    while (Consume(',')) {  // assumptions: positive=True, integer=True
      Identifier();
      if (!Consume('=') || Identifier().empty()) return Refused("a Symbol argument that is not KEY=VALUE");
    }
    if (!Consume(')')) return Refused(absl::StrCat("expected ')' at ", pos_));
    return LinearSize{name, 1, 0};
  }

  std::string Identifier() {
    SkipSpaces();
    const size_t start = pos_;
    while (pos_ < text_.size() && (absl::ascii_isalnum(text_[pos_]) || text_[pos_] == '_')) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  bool Consume(char c) {
    SkipSpaces();
    if (pos_ >= text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }

  void SkipSpaces() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<LinearSize> ParseSizeExpression(absl::string_view srepr) {
  if (srepr.size() > kMaxSizeExpressionLength) return Refused("longer than 4096 characters");
  absl::StatusOr<LinearSize> size = Parser(srepr).Whole();
  if (size.ok() && !size->symbol.empty() && size->coefficient == 0) return Refused("a symbol with coefficient 0");
  return size;
}

}  // namespace recal
