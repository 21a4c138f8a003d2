#include <exception>
#include <utility>
#include <vector>

#include <torch/csrc/jit/serialization/pickle.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/mapped_file.h"
#include "server/data/sliced_source.h"
#include "server/data/sources.h"
#include "server/data/torch_error.h"

namespace recal::data {
namespace {

// What a Python user would call the value's type (LibTorch's tag names are its own: GenericDict).
std::string PythonTypeOf(const c10::IValue& value) {
  if (value.isGenericDict()) return "dict";
  if (value.isInt()) return "int";
  if (value.isDouble()) return "float";
  if (value.isBool()) return "bool";
  if (value.isString()) return "str";
  if (value.isNone()) return "None";
  return value.tagKind();
}

absl::StatusOr<std::vector<NamedInput>> InputsOf(const c10::IValue& value, const std::string& label) {
  std::vector<c10::IValue> items;
  if (value.isTensor()) {
    items.push_back(value);
  } else if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) items.push_back(item);
  } else if (value.isTuple()) {
    for (const c10::IValue& item : value.toTupleRef().elements()) items.push_back(item);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(label, ": holds a value of type ", PythonTypeOf(value),
                                                   "; expected a tensor or a list/tuple of tensors"));
  }
  std::vector<NamedInput> inputs;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].isTensor()) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": element ", i, " is of type ", PythonTypeOf(items[i]),
                                                     "; expected a tensor or a list/tuple of tensors"));
    }
    // A saved nn.Parameter or a tensor that required grad must not drag autograd along.
    inputs.push_back({absl::StrCat("input ", i), items[i].toTensor().detach()});
  }
  return inputs;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenTorchSource(const std::string& path, int64_t batch_size) {
  const std::string label = absl::StrCat("torch:", path);
  std::vector<char> bytes;
  {
    absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
    if (!file.ok()) return file.status();
    const absl::string_view view = (*file)->bytes();
    // Before torch 1.6 (or with _use_new_zipfile_serialization=False) torch.save wrote a
    // bare pickle stream that LibTorch cannot read; say so instead of a zip error.
    if (!absl::StartsWith(view, absl::string_view("PK\x03\x04", 4))) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": not a zip-format torch.save file (legacy format?); re-save it in Python "
                 "with torch.save(obj, path) from torch >= 1.6"));
    }
    bytes.assign(view.begin(), view.end());
  }
  std::vector<NamedInput> inputs;
  try {
    const c10::IValue value = torch::jit::pickle_load(bytes);
    bytes = std::vector<char>();  // the tensors own their storage now
    absl::StatusOr<std::vector<NamedInput>> found = InputsOf(value, label);
    if (!found.ok()) return found.status();
    inputs = *std::move(found);
  } catch (const std::exception& e) {
    // LibTorch's unpickler knows tensors and containers, not arbitrary Python classes, so
    // point at what it does read.
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": cannot load with torch::pickle_load (it reads a torch.save'd tensor or "
               "list/tuple of tensors): ",
        ExceptionMessage(e)));
  }
  if (inputs.empty()) return absl::InvalidArgumentError(absl::StrCat(label, ": holds an empty list"));
  if (inputs.size() == 1) inputs[0].name = "the tensor";
  for (const NamedInput& input : inputs) {
    if (!input.tensor.device().is_cpu() || input.tensor.is_sparse() || input.tensor.is_quantized()) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": ", input.name,
                                                     " is not a dense CPU tensor"));
    }
  }
  return MakeSlicedSource(label, std::move(inputs), nullptr, batch_size);
}

}  // namespace recal::data
