#include "common/input_contract.h"

#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace recal {
namespace {

enum class DtypeKind { kFloating, kInteger, kBool, kOther };

DtypeKind KindOf(absl::string_view dtype) {
  if (absl::StartsWith(dtype, "float") || dtype == "bfloat16") return DtypeKind::kFloating;
  if (absl::StartsWith(dtype, "int") || absl::StartsWith(dtype, "uint")) return DtypeKind::kInteger;
  if (dtype == "bool") return DtypeKind::kBool;
  return DtypeKind::kOther;
}

std::string SizesText(const std::vector<int64_t>& sizes) {
  return sizes.empty() ? "a scalar" : absl::StrJoin(sizes, "x");
}

std::string TensorText(const TensorShape& t) { return absl::StrCat(SizesText(t.sizes), " ", t.dtype); }

bool IsBare(const v1::DynamicSize& size) { return size.coefficient() == 1 && size.offset() == 0; }

// "2*s40+1", "s0", "s1-1".
std::string ExpressionText(const v1::DynamicSize& size) {
  std::string text = size.coefficient() == 1 ? size.symbol() : absl::StrCat(size.coefficient(), "*", size.symbol());
  if (size.offset() != 0) absl::StrAppend(&text, size.offset() > 0 ? "+" : "", size.offset());
  return text;
}

// The value of coefficient * s + offset, std::nullopt beyond int64.
std::optional<int64_t> Evaluate(const v1::DynamicSize& size, int64_t s) {
  int64_t scaled, value;
  if (__builtin_mul_overflow(size.coefficient(), s, &scaled) || __builtin_add_overflow(scaled, size.offset(), &value)) {
    return std::nullopt;
  }
  return value;
}

// torch enforces a Dim's lower bound only where the size it gives there is above 2 (export
// specialises 0 and 1, and lets them pass at run time).
bool LowerEnforced(const v1::DynamicSize& size) {
  const std::optional<int64_t> lowest = Evaluate(size, size.min());
  return !lowest || *lowest > 2;
}

// Whether the symbol's value `s` lies in its Dim's range, as torch checks it.
bool InRange(const v1::DynamicSize& size, int64_t s) {
  if (size.has_max() && s > size.max()) return false;
  return !LowerEnforced(size) || s >= size.min();
}

// The symbol's range as torch enforces it there.
std::string RangeText(const v1::DynamicSize& size) {
  const bool lower = LowerEnforced(size);
  if (!lower && !size.has_max()) return "any size";
  if (!lower) return absl::StrCat("at most ", size.max());
  if (!size.has_max()) return absl::StrCat("at least ", size.min());
  return absl::StrCat(size.min(), "..", size.max());
}

std::string DimText(const v1::InputDim& dim) {
  switch (dim.size_case()) {
    case v1::InputDim::kFixed: return absl::StrCat(dim.fixed());
    case v1::InputDim::kDynamic: return ExpressionText(dim.dynamic());
    default: return "?";
  }
}

std::string DtypeFix(absl::string_view wanted, absl::string_view got) {
  const std::string numpy = absl::StrCat("numpy: x.astype(np.", wanted, "); torch: x.to(torch.", wanted, ")");
  if (KindOf(wanted) == DtypeKind::kFloating) {
    return absl::StrCat("Recal converts uint8, float16 and float32 data to float32 (dividing by the data's "
                        "scale=S when given, e.g. scale=255 for 0..255 pixels) and casts floating data to the "
                        "program's dtype, but no ", got, " data: store it as float32 or uint8 (", numpy, ")");
  }
  return absl::StrCat("the program takes ", wanted, " (token ids, indices); Recal turns uint8 and float16 data "
                      "into float32 and casts nothing else: store the data as ", wanted, " (", numpy, ")");
}

// One batch against the inputs: Check() runs the passes in the order that gives the
// clearest message (count, ranks and dtypes, fixed sizes and Dims, then derived sizes).
class BatchCheck {
 public:
  BatchCheck(const ModelInputs& inputs, const std::vector<TensorShape>& batch) : inputs_(inputs), batch_(batch) {}

  absl::Status Check() {
    RECAL_RETURN_IF_ERROR(Count());
    for (size_t i = 0; i < batch_.size(); ++i) {
      RECAL_RETURN_IF_ERROR(Rank(i));
      RECAL_RETURN_IF_ERROR(Dtype(i));
    }
    for (bool derived : {false, true}) {
      for (size_t i = 0; i < batch_.size(); ++i) {
        if (inputs_[i].any_shape()) continue;
        for (size_t d = 0; d < batch_[i].sizes.size(); ++d) RECAL_RETURN_IF_ERROR(Dim(i, d, derived));
      }
    }
    return absl::OkStatus();
  }

 private:
  // The value a symbol took, and the first dim that gave it.
  struct Binding {
    int64_t value;
    size_t input, dim;
  };

  absl::Status Count() const {
    size_t required = 0;
    std::vector<std::string> names;
    for (const v1::ModelInput& input : inputs_) {
      required += input.optional() ? 0 : 1;
      names.push_back(input.name());
    }
    if (batch_.size() >= required && batch_.size() <= static_cast<size_t>(inputs_.size())) return absl::OkStatus();
    const std::string takes = required == static_cast<size_t>(inputs_.size())
                                  ? absl::StrCat(required)
                                  : absl::StrCat(required, " to ", inputs_.size());
    return absl::InvalidArgumentError(absl::StrCat(
        "the model takes ", takes, " tensor input", inputs_.size() == 1 ? "" : "s", " (", absl::StrJoin(names, ", "),
        "), but the data gives ", batch_.size(), " per batch: give one tensor per input, in order (a safetensors "
        "file with one key per input, or a torch: file holding a list of tensors)"));
  }

  absl::Status Rank(size_t i) const {
    const v1::ModelInput& input = inputs_[i];
    if (input.any_shape() || batch_[i].sizes.size() == static_cast<size_t>(input.dims_size())) return absl::OkStatus();
    return Refuse(i, absl::StrCat("input '", input.name(), "' has ", batch_[i].sizes.size(),
                                  " dims, but the program was exported for ", input.dims_size()),
                  absl::StrCat("give ", input.dims_size(), "-d data (dim 0 the batch)"));
  }

  absl::Status Dtype(size_t i) const {
    const std::string& wanted = inputs_[i].dtype();
    const std::string& got = batch_[i].dtype;
    if (wanted.empty() || wanted == got ||
        (KindOf(wanted) == DtypeKind::kFloating && KindOf(got) == DtypeKind::kFloating)) {
      return absl::OkStatus();
    }
    return Refuse(i, absl::StrCat("input '", inputs_[i].name(), "' is ", got, ", but the program takes ", wanted),
                  DtypeFix(wanted, got));
  }

  absl::Status Dim(size_t i, size_t d, bool derived) {
    const v1::InputDim& dim = inputs_[i].dims(static_cast<int>(d));
    const int64_t got = batch_[i].sizes[d];
    if (dim.has_fixed()) return derived || got == dim.fixed() ? absl::OkStatus() : Fixed(i, d, dim.fixed());
    if (!dim.has_dynamic() || dim.dynamic().coefficient() < 1 || IsBare(dim.dynamic()) == derived) {
      return absl::OkStatus();  // unchecked, or not this pass's
    }
    const v1::DynamicSize& size = dim.dynamic();
    auto bound = bindings_.find(size.symbol());
    if (bound != bindings_.end()) {
      const std::optional<int64_t> expected = Evaluate(size, bound->second.value);
      return expected == got ? absl::OkStatus() : Disagrees(i, d, bound->second, expected);
    }
    int64_t above;
    if (__builtin_sub_overflow(got, size.offset(), &above) || above < 0 || above % size.coefficient() != 0) {
      return NoSolution(i, d);
    }
    const int64_t s = above / size.coefficient();
    if (!InRange(size, s)) return OutOfRange(i, d, s);
    bindings_.emplace(size.symbol(), Binding{s, i, d});
    return absl::OkStatus();
  }

  std::string Where(size_t i, size_t d) const {
    return absl::StrCat("input '", inputs_[i].name(), "' dim ", d, d == 0 ? " (the batch)" : "");
  }

  absl::Status Fixed(size_t i, size_t d, int64_t want) const {
    const std::string what = absl::StrCat(Where(i, d), " is ", batch_[i].sizes[d], ", but the program was exported for ",
                                          d == 0 ? "batches of exactly " : "exactly ", want);
    if (d == 0) {
      return Refuse(i, what, absl::StrCat("use batches of ", want, " (batch_size ", want, ", and a sample count that is a "
                                          "multiple of it), or export with dynamic_shapes={0: "
                                          "torch.export.Dim(\"batch\", min=1)} for every input"));
    }
    return Refuse(i, what, absl::StrCat("give data of size ", want, " in dim ", d, " (resize or crop it), or export with "
                                        "dynamic_shapes that make dim ", d, " a torch.export.Dim"));
  }

  absl::Status OutOfRange(size_t i, size_t d, int64_t s) const {
    const v1::DynamicSize& size = inputs_[i].dims(static_cast<int>(d)).dynamic();
    const std::string solved = IsBare(size) ? "" : absl::StrCat(" (", ExpressionText(size), " with ", size.symbol(), " = ", s, ")");
    return Refuse(i, absl::StrCat(Where(i, d), " is ", batch_[i].sizes[d], solved, ", but the program was exported for a torch.export.Dim there (",
                                  size.symbol(), ": ", RangeText(size), ")"),
                  absl::StrCat("give data whose dim ", d, " fits that range, or export with a Dim whose min and max "
                               "cover it"));
  }

  absl::Status NoSolution(size_t i, size_t d) const {
    const v1::DynamicSize& size = inputs_[i].dims(static_cast<int>(d)).dynamic();
    return Refuse(i, absl::StrCat(Where(i, d), " is ", batch_[i].sizes[d], ", but the program was exported for ",
                                  ExpressionText(size), " there, and no whole ", size.symbol(), " gives that"),
                  absl::StrCat("give data of that form (", size.symbol(), ": ", RangeText(size), ")"));
  }

  absl::Status Disagrees(size_t i, size_t d, const Binding& first, std::optional<int64_t> expected) const {
    const v1::DynamicSize& size = inputs_[i].dims(static_cast<int>(d)).dynamic();
    const std::string here = absl::StrCat(Where(i, d), " is ", batch_[i].sizes[d]);
    const std::string other = Where(first.input, first.dim);
    const int64_t other_size = batch_[first.input].sizes[first.dim];
    if (d == 0 && first.dim == 0) {
      return Refuse(i, absl::StrCat(here, ", but ", other, " is ", other_size),
                    "the program takes one batch size for all its inputs: give each input the same number of samples");
    }
    const std::string want =
        IsBare(size) ? absl::StrCat("equal to ", other, ", which is ", other_size, ": one torch.export.Dim, ",
                                    size.symbol(), ", for both")
                     : absl::StrCat(ExpressionText(size), " = ", expected ? absl::StrCat(*expected) : "beyond int64", ", ",
                                    size.symbol(), " being ", first.value, " from ", other);
    return Refuse(i, absl::StrCat(here, ", but the program was exported with it ", want),
                  "give data whose dims agree so, or export with a Dim of their own for each");
  }

  absl::Status Refuse(size_t i, absl::string_view what, absl::string_view fix) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " (the data gives ", TensorText(batch_[i]),
                                                   "; the program takes ", DescribeInput(inputs_[i]), "): ", fix));
  }

  const ModelInputs& inputs_;
  const std::vector<TensorShape>& batch_;
  std::map<std::string, Binding> bindings_;
};

std::vector<TensorShape> BatchOf(const DataShape& data, int64_t samples) {
  std::vector<TensorShape> batch;
  for (const TensorShape& sample : data.samples) {
    TensorShape t{{samples}, sample.dtype};
    t.sizes.insert(t.sizes.end(), sample.sizes.begin(), sample.sizes.end());
    batch.push_back(std::move(t));
  }
  return batch;
}

}  // namespace

absl::Status CheckBatch(const ModelInputs& inputs, const std::vector<TensorShape>& batch) {
  if (inputs.empty()) return absl::OkStatus();
  return BatchCheck(inputs, batch).Check();
}

absl::Status CheckData(const ModelInputs& inputs, const DataShape& data, int64_t batch_size, int64_t max_batches) {
  if (inputs.empty() || batch_size < 1 || (data.count && *data.count < 1)) return absl::OkStatus();
  const int64_t first = data.count ? std::min(batch_size, *data.count) : batch_size;
  RECAL_RETURN_IF_ERROR(CheckBatch(inputs, BatchOf(data, first)));
  if (!data.count) return absl::OkStatus();
  const int64_t full = *data.count / batch_size, rest = *data.count % batch_size;
  if (rest == 0 || full == 0 || (max_batches > 0 && full >= max_batches)) return absl::OkStatus();
  const absl::Status last = CheckBatch(inputs, BatchOf(data, rest));
  if (last.ok()) return last;
  return absl::InvalidArgumentError(absl::StrCat("the last batch holds ", rest, " of the data's ", *data.count,
                                                 " samples (batches of ", batch_size, "): ", last.message()));
}

std::vector<std::string> CastNotes(const ModelInputs& inputs, const std::vector<TensorShape>& samples) {
  std::vector<std::string> notes;
  for (size_t i = 0; i < samples.size() && i < static_cast<size_t>(inputs.size()); ++i) {
    const std::string& wanted = inputs[i].dtype();
    const std::string& got = samples[i].dtype;
    if (wanted.empty() || wanted == got || KindOf(wanted) != DtypeKind::kFloating ||
        KindOf(got) != DtypeKind::kFloating) {
      continue;
    }
    notes.push_back(absl::StrCat("input '", inputs[i].name(), "': ", got, " data is cast to ", wanted,
                                 ", the dtype the program was exported with"));
  }
  return notes;
}

std::string DtypeReachingModel(absl::string_view dtype) {
  return dtype == "uint8" || dtype == "float16" ? "float32" : std::string(dtype);
}

std::string DescribeInput(const v1::ModelInput& input) {
  std::string text = absl::StrCat(input.name(), ": ", input.dtype().empty() ? "tensor" : input.dtype());
  if (input.any_shape()) return absl::StrCat(text, " of any shape");
  std::vector<std::string> dims;
  for (const v1::InputDim& dim : input.dims()) dims.push_back(DimText(dim));
  return absl::StrCat(text, " [", absl::StrJoin(dims, ", "), "]");
}

}  // namespace recal
