#include <exception>
#include <utility>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/formats/npy.h"
#include "server/data/sliced_source.h"
#include "server/data/sources.h"
#include "server/data/torch_dtype.h"
#include "server/data/torch_error.h"

namespace recal::data {
namespace {

// np.save pads the header to 64 bytes (128 for many dims); 4 KiB holds any real header in
// the first read, and costs a ranged GET no more than 64 bytes would.
constexpr int64_t kFirstHeaderRead = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<BatchSource>> OpenNpySource(const std::string& path, int64_t batch_size) {
  absl::StatusOr<std::shared_ptr<const RandomAccessFile>> file = OpenLocalFile(path);
  if (!file.ok()) return file.status();
  return OpenNpySource(*std::move(file), batch_size);
}

absl::StatusOr<std::unique_ptr<BatchSource>> OpenNpySource(std::shared_ptr<const RandomAccessFile> file,
                                                           int64_t batch_size) {
  const std::string label = absl::StrCat("npy:", file->name());
  std::string header_bytes;
  if (file->mapped() == nullptr) {
    absl::StatusOr<std::string> read = ReadFileHeader(*file, kFirstHeaderRead, formats::NpyHeaderSize);
    if (!read.ok()) return absl::Status(read.status().code(), absl::StrCat(label, ": ", read.status().message()));
    header_bytes = *std::move(read);
  }
  // A mapped file is parsed in place, whole; else the header just read.
  const absl::string_view bytes =
      file->mapped() != nullptr ? absl::string_view(file->mapped(), file->size()) : absl::string_view(header_bytes);
  absl::StatusOr<formats::NpyHeader> header = formats::ParseNpyHeaderOfFile(bytes, file->size());
  if (!header.ok()) {
    return absl::Status(header.status().code(), absl::StrCat(label, ": ", header.status().message()));
  }
  std::vector<NamedInput> inputs(1);
  inputs[0].name = "the array";
  inputs[0].offset = header->data_offset;
  const at::TensorOptions dtype = at::TensorOptions().dtype(ToScalarType(header->dtype));
  try {
    if (file->mapped() == nullptr) {
      inputs[0].tensor = at::empty(header->shape, dtype.device(at::kMeta));
      return MakeRangedSource(label, std::move(inputs), std::move(file), batch_size);
    }
    // The mapping is read-only; the view is only ever read (narrow + clone).
    void* data = const_cast<char*>(file->mapped() + header->data_offset);
    inputs[0].tensor = at::from_blob(data, header->shape, dtype);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(label, ": cannot view the array: ", ExceptionMessage(e)));
  }
  return MakeSlicedSource(label, std::move(inputs), std::move(file), batch_size);
}

}  // namespace recal::data
