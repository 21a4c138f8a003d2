// The operators whose `train` argument decides whether they drop activations: what
// Options::modules fixes in a TorchScript graph (graph_rewrite.cc) and in an exported one
// (exported/observed_program.cc) alike.
#pragma once

#include <string_view>

namespace recal::engine {

// `qualified_name`: "aten::dropout" (no overload name).
inline bool IsDropoutOp(std::string_view qualified_name) {
  constexpr std::string_view kDropoutOps[] = {
      "aten::dropout",         "aten::dropout_",          "aten::feature_dropout",
      "aten::feature_dropout_", "aten::alpha_dropout",     "aten::alpha_dropout_",
      "aten::feature_alpha_dropout", "aten::feature_alpha_dropout_", "aten::native_dropout"};
  for (std::string_view op : kDropoutOps) {
    if (op == qualified_name) return true;
  }
  return false;
}

}  // namespace recal::engine
