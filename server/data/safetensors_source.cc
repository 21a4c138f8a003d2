#include <exception>
#include <utility>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/formats/safetensors.h"
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

// Most headers list a few tensors in well under 64 KiB: one ranged GET; a longer one (many
// tensors) takes a second.
constexpr int64_t kFirstHeaderRead = 64 << 10;

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenSafetensorsSource(const std::string& path,
                                                                   const std::vector<std::string>& keys,
                                                                   int64_t batch_size) {
  absl::StatusOr<std::shared_ptr<const RandomAccessFile>> file = OpenLocalFile(path);
  if (!file.ok()) return file.status();
  return OpenSafetensorsSource(*std::move(file), keys, batch_size);
}

absl::StatusOr<std::unique_ptr<BatchSource>> OpenSafetensorsSource(std::shared_ptr<const RandomAccessFile> file,
                                                                   const std::vector<std::string>& keys,
                                                                   int64_t batch_size) {
  std::string label = absl::StrCat("safetensors:", file->name());
  if (!keys.empty()) absl::StrAppend(&label, ":", absl::StrJoin(keys, ","));
  std::string header_bytes;
  if (file->mapped() == nullptr) {
    absl::StatusOr<std::string> read = ReadFileHeader(*file, kFirstHeaderRead, formats::SafetensorsHeaderSize);
    if (!read.ok()) return absl::Status(read.status().code(), absl::StrCat(label, ": ", read.status().message()));
    header_bytes = *std::move(read);
  }
  // A mapped file is parsed in place, whole; else the header just read.
  const absl::string_view bytes =
      file->mapped() != nullptr ? absl::string_view(file->mapped(), file->size()) : absl::string_view(header_bytes);
  absl::StatusOr<formats::SafetensorsHeader> header = formats::ParseSafetensorsHeader(bytes, file->size());
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

  std::vector<NamedInput> inputs;
  try {
    for (const formats::SafetensorsTensorInfo* t : chosen) {
      const at::TensorOptions dtype = at::TensorOptions().dtype(ToScalarType(t->dtype));
      NamedInput input{absl::StrCat("'", t->name, "'"), {}, header->data_offset + t->begin};
      if (file->mapped() == nullptr) {
        input.tensor = at::empty(t->shape, dtype.device(at::kMeta));
      } else {
        // The mapping is read-only; the view is only ever read (narrow + clone).
        input.tensor = at::from_blob(const_cast<char*>(file->mapped() + input.offset), t->shape, dtype);
      }
      inputs.push_back(std::move(input));
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(label, ": cannot view the tensors: ", ExceptionMessage(e)));
  }
  if (file->mapped() == nullptr) return MakeRangedSource(std::move(label), std::move(inputs), std::move(file), batch_size);
  return MakeSlicedSource(std::move(label), std::move(inputs), std::move(file), batch_size);
}

}  // namespace recal::data
