#include <exception>
#include <utility>

#include <ATen/ops/from_blob.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/formats/safetensors.h"
#include "common/mapped_file.h"
#include "server/data/sliced_source.h"
#include "server/data/sources.h"
#include "server/data/torch_dtype.h"
#include "server/data/torch_error.h"

namespace recal::data {
namespace {

std::string KeyList(const formats::SafetensorsHeader& header) {
  constexpr size_t kMaxListed = 20;
  std::vector<absl::string_view> names;
  for (const auto& t : header.tensors) {
    if (names.size() == kMaxListed) break;
    names.push_back(t.name);
  }
  std::string out = absl::StrJoin(names, ", ");
  if (header.tensors.size() > kMaxListed) {
    absl::StrAppend(&out, ", ... (", header.tensors.size(), " in all)");
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenSafetensorsSource(const std::string& path,
                                                                   const std::vector<std::string>& keys,
                                                                   int64_t batch_size) {
  std::string label = absl::StrCat("safetensors:", path);
  if (!keys.empty()) absl::StrAppend(&label, ":", absl::StrJoin(keys, ","));
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<formats::SafetensorsHeader> header = formats::ParseSafetensors((*file)->bytes());
  if (!header.ok()) {
    return absl::Status(header.status().code(), absl::StrCat(label, ": ", header.status().message()));
  }
  std::vector<const formats::SafetensorsTensorInfo*> chosen;
  if (keys.empty()) {
    for (const auto& t : header->tensors) chosen.push_back(&t);
  } else {
    for (const std::string& key : keys) {
      const formats::SafetensorsTensorInfo* t = header->Find(key);
      if (t == nullptr) {
        return absl::NotFoundError(absl::StrCat(label, ": no tensor '", key, "' in the file; it has: ",
                                                KeyList(*header)));
      }
      chosen.push_back(t);
    }
  }

  std::shared_ptr<const MappedFile> mapped = *std::move(file);
  const char* data_section = mapped->bytes().data() + header->data_offset;
  std::vector<NamedInput> inputs;
  try {
    for (const formats::SafetensorsTensorInfo* t : chosen) {
      // The mapping is read-only; the view is only ever read (narrow + clone).
      void* data = const_cast<char*>(data_section + t->begin);
      inputs.push_back({absl::StrCat("'", t->name, "'"),
                        at::from_blob(data, t->shape, at::TensorOptions().dtype(ToScalarType(t->dtype)))});
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(label, ": cannot view the tensors: ", ExceptionMessage(e)));
  }
  return MakeSlicedSource(std::move(label), std::move(inputs), std::move(mapped), batch_size);
}

}  // namespace recal::data
