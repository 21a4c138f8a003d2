#include "server/engine/exported/input_contract.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/size_expression.h"
#include "common/status_macros.h"
#include "server/engine/exported/serialized_types.h"

namespace recal::engine::exported {
namespace {

using nlohmann::json;

struct Range {
  int64_t min = 0;
  std::optional<int64_t> max;  // unbounded
};

// torch writes an unbounded side as null; a bound this far out is no bound a tensor meets.
constexpr int64_t kUnbounded = int64_t{1} << 62;

bool IsSymbolName(const std::string& key) {
  return !key.empty() && std::all_of(key.begin(), key.end(), [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
}

// range_constraints by symbol ("s0": {"min_val": 1, "max_val": null}); the entries keyed by
// a derived expression ("2*s1 + 1") follow from their symbol's and are not needed.
std::map<std::string, Range> ReadRanges(const json& constraints) {
  std::map<std::string, Range> ranges;
  if (!constraints.is_object()) return ranges;
  for (const auto& [key, value] : constraints.items()) {
    if (!IsSymbolName(key) || !value.is_object()) continue;
    Range range;
    const json& min = value.value("min_val", json());
    const json& max = value.value("max_val", json());
    if (min.is_number_integer()) range.min = std::max<int64_t>(0, min.get<int64_t>());
    if (max.is_number_integer() && max.get<int64_t>() < kUnbounded) range.max = max.get<int64_t>();
    ranges[key] = range;
  }
  return ranges;
}

v1::InputDim ReadDim(const json& size, const std::map<std::string, Range>& ranges) {
  v1::InputDim dim;
  if (size.contains("as_int") && size["as_int"].is_number_integer()) {
    dim.set_fixed(size["as_int"].get<int64_t>());
    return dim;
  }
  const json& expr = size.contains("as_expr") ? size["as_expr"].value("expr_str", json()) : json();
  const std::string text = expr.is_string() ? expr.get<std::string>() : size.dump();
  const absl::StatusOr<LinearSize> linear = ParseSizeExpression(text);
  if (!linear.ok()) {
    dim.set_unchecked(text.substr(0, kMaxSizeExpressionLength));
  } else if (linear->symbol.empty()) {
    dim.set_fixed(linear->offset);
  } else {
    v1::DynamicSize* dynamic = dim.mutable_dynamic();
    dynamic->set_symbol(linear->symbol);
    dynamic->set_coefficient(linear->coefficient);
    dynamic->set_offset(linear->offset);
    auto range = ranges.find(linear->symbol);
    if (range != ranges.end()) {
      dynamic->set_min(range->second.min);
      if (range->second.max) dynamic->set_max(*range->second.max);
    }
  }
  return dim;
}

absl::StatusOr<v1::ModelInput> ReadInput(const std::string& name, const json& meta,
                                         const std::map<std::string, Range>& ranges) {
  v1::ModelInput input;
  input.set_name(name);
  RECAL_ASSIGN_OR_RETURN(const c10::ScalarType dtype, ScalarTypeOf(SchemaInt(meta.at("dtype"))));
  input.set_dtype(std::string(c10::getDtypeNames(dtype).first));
  for (const json& size : meta.at("sizes")) *input.add_dims() = ReadDim(size, ranges);
  return input;
}

}  // namespace

absl::StatusOr<ModelInputs> ReadInputContract(const json& program) {
  try {
    const json& module = program.at("graph_module");
    const json& values = module.at("graph").at("tensor_values");
    const std::map<std::string, Range> ranges = ReadRanges(program.value("range_constraints", json::object()));
    ModelInputs inputs;
    for (const json& spec : module.at("signature").at("input_specs")) {
      if (!spec.contains("user_input")) continue;
      const json& arg = spec["user_input"].at("arg");
      if (!arg.contains("as_tensor")) continue;  // a non-tensor input is fixed at export
      const std::string name = arg["as_tensor"].at("name").get<std::string>();
      RECAL_ASSIGN_OR_RETURN(*inputs.Add(), ReadInput(name, values.at(name), ranges));
    }
    return inputs;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("exported program: malformed input signature: ", e.what()));
  }
}

}  // namespace recal::engine::exported
