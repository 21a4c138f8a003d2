// torch.export's size expressions (sympy srepr, as torch 2.14 writes them into a program's
// tensor_values) read into coefficient * symbol + offset, and everything else refused.
#include "common/size_expression.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace recal {
namespace {

using ::testing::HasSubstr;

constexpr char kS0[] = "Symbol('s0', positive=True, integer=True)";

absl::StatusOr<LinearSize> Parse(const std::string& text) { return ParseSizeExpression(text); }

TEST(SizeExpression, ReadsWhatTorchExportWrites) {
  // Verbatim from a torch 2.14 program: a Dim, 2*d + 1 and 2*d.
  EXPECT_EQ(*Parse(kS0), (LinearSize{"s0", 1, 0}));
  EXPECT_EQ(*Parse("Add(Mul(Integer(2), Symbol('s40', positive=True, integer=True)), Integer(1))"),
            (LinearSize{"s40", 2, 1}));
  EXPECT_EQ(*Parse("Mul(Integer(2), Symbol('s39', positive=True, integer=True))"), (LinearSize{"s39", 2, 0}));
}

TEST(SizeExpression, AnyOrderSignAndNesting) {
  EXPECT_EQ(*Parse(std::string("Add(Integer(-1), ") + kS0 + ")"), (LinearSize{"s0", 1, -1}));
  EXPECT_EQ(*Parse(std::string("Mul(") + kS0 + ", Integer(3))"), (LinearSize{"s0", 3, 0}));
  EXPECT_EQ(*Parse(std::string("Mul(Integer(2), Add(") + kS0 + ", Integer(4)))"), (LinearSize{"s0", 2, 8}));
  EXPECT_EQ(*Parse(std::string("Add(") + kS0 + ", " + kS0 + ")"), (LinearSize{"s0", 2, 0}));
  EXPECT_EQ(*Parse("Symbol('s1')"), (LinearSize{"s1", 1, 0}));
  EXPECT_EQ(*Parse("Integer(7)"), (LinearSize{"", 0, 7}));
}

TEST(SizeExpression, RefusesWhatIsNotLinearInOneSymbol) {
  EXPECT_THAT(Parse(std::string("FloorDiv(") + kS0 + ", Integer(2))").status().message(), HasSubstr("'FloorDiv'"));
  EXPECT_THAT(Parse(std::string("Pow(") + kS0 + ", Integer(2))").status().message(), HasSubstr("'Pow'"));
  EXPECT_THAT(Parse(std::string("Mul(") + kS0 + ", Symbol('s1'))").status().message(), HasSubstr("product of symbols"));
  EXPECT_THAT(Parse(std::string("Add(") + kS0 + ", Symbol('s1'))").status().message(), HasSubstr("sum of two symbols"));
  EXPECT_THAT(Parse(std::string("Mul(Integer(0), ") + kS0 + ")").status().message(), HasSubstr("coefficient 0"));
}

TEST(SizeExpression, RefusesMalformedAndHostileText) {
  for (const std::string bad :
       {"", "Symbol(s0)", "Symbol('s0'", "Integer()", "Integer(1x)", "Add()", "Add(Integer(1),)",
        "Integer(99999999999999999999)", "Symbol('s0', positive)", "Integer(1) trailing", "Symbol('a b')"}) {
    EXPECT_FALSE(Parse(bad).ok()) << bad;
  }
  EXPECT_THAT(Parse("Mul(Integer(4611686018427387904), Integer(4))").status().message(), HasSubstr("beyond int64"));
  std::string deep;
  for (int i = 0; i < 40; ++i) deep += "Add(";
  deep += "Integer(1)";
  for (int i = 0; i < 40; ++i) deep += ")";
  EXPECT_THAT(Parse(deep).status().message(), HasSubstr("too deep"));
  EXPECT_THAT(Parse(std::string(5000, ' ')).status().message(), HasSubstr("longer than"));
}

}  // namespace
}  // namespace recal
