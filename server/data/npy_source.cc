#include <exception>
#include <utility>

#include <ATen/ops/from_blob.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/formats/npy.h"
#include "common/mapped_file.h"
#include "server/data/sliced_source.h"
#include "server/data/sources.h"
#include "server/data/torch_dtype.h"
#include "server/data/torch_error.h"

namespace recal::data {

absl::StatusOr<std::unique_ptr<BatchSource>> OpenNpySource(const std::string& path, int64_t batch_size) {
  const std::string label = absl::StrCat("npy:", path);
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<formats::NpyHeader> header = formats::ParseNpyFile((*file)->bytes());
  if (!header.ok()) {
    return absl::Status(header.status().code(), absl::StrCat(label, ": ", header.status().message()));
  }
  std::shared_ptr<const MappedFile> mapped = *std::move(file);
  std::vector<NamedInput> inputs(1);
  inputs[0].name = "the array";
  try {
    // The mapping is read-only; the view is only ever read (narrow + clone).
    void* data = const_cast<char*>(mapped->bytes().data() + header->data_offset);
    inputs[0].tensor = at::from_blob(data, header->shape, at::TensorOptions().dtype(ToScalarType(header->dtype)));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(label, ": cannot view the array: ", ExceptionMessage(e)));
  }
  return MakeSlicedSource(label, std::move(inputs), std::move(mapped), batch_size);
}

}  // namespace recal::data
