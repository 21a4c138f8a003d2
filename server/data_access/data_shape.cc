#include "server/data_access/data_shape.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/formats/npy.h"
#include "common/formats/safetensors.h"
#include "server/data_access/random_access_file.h"
#include "server/data_access/s3_paths.h"

namespace recal::data {
namespace {

// A header is at most this long to be read at admission; a longer one is left to the worker.
constexpr int64_t kMaxHeaderRead = 1 << 20;

TensorShape SampleOf(const std::vector<int64_t>& shape, formats::DType dtype) {
  return {std::vector<int64_t>(shape.begin() + 1, shape.end()), DtypeReachingModel(formats::DTypeName(dtype))};
}

struct FileHeader {
  std::string bytes;  // the file's start, through its header
  int64_t file_size = 0;
};

template <typename HeaderSize>
std::optional<FileHeader> ReadHeader(const std::string& path, int64_t first_read, const HeaderSize& header_size) {
  if (IsS3Path(path)) return std::nullopt;  // the api asks nothing of the endpoint
  absl::StatusOr<std::shared_ptr<const RandomAccessFile>> file = OpenLocalFile(path);
  if (!file.ok()) return std::nullopt;
  absl::StatusOr<std::string> bytes = ReadFileHeader(**file, first_read, [&](absl::string_view prefix) {
    absl::StatusOr<int64_t> size = header_size(prefix);
    if (size.ok() && *size > kMaxHeaderRead) return absl::StatusOr<int64_t>(absl::OutOfRangeError("a long header"));
    return size;
  });
  if (!bytes.ok()) return std::nullopt;
  return FileHeader{*std::move(bytes), (*file)->size()};
}

std::optional<DataShape> NpyShape(const std::string& path) {
  const std::optional<FileHeader> file = ReadHeader(path, 4096, formats::NpyHeaderSize);
  if (!file) return std::nullopt;
  absl::StatusOr<formats::NpyHeader> header = formats::ParseNpyHeaderOfFile(file->bytes, file->file_size);
  if (!header.ok() || header->shape.empty()) return std::nullopt;
  return DataShape{{SampleOf(header->shape, header->dtype)}, header->shape[0]};
}

std::optional<DataShape> SafetensorsShape(const std::string& path, const std::vector<std::string>& keys) {
  const std::optional<FileHeader> file = ReadHeader(path, 64 << 10, formats::SafetensorsHeaderSize);
  if (!file) return std::nullopt;
  absl::StatusOr<formats::SafetensorsHeader> header = formats::ParseSafetensorsHeader(file->bytes, file->file_size);
  if (!header.ok()) return std::nullopt;
  std::vector<const formats::SafetensorsTensorInfo*> chosen;
  if (keys.empty()) {
    for (const formats::SafetensorsTensorInfo& t : header->tensors) chosen.push_back(&t);
  }
  for (const std::string& key : keys) chosen.push_back(header->Find(key));
  DataShape shape;
  for (const formats::SafetensorsTensorInfo* t : chosen) {
    if (t == nullptr || t->shape.empty()) return std::nullopt;  // the worker says which key is missing
    if (shape.samples.empty()) shape.count = t->shape[0];
    if (shape.count != t->shape[0]) shape.count.reset();  // the worker refuses such a file
    shape.samples.push_back(SampleOf(t->shape, t->dtype));
  }
  return shape;
}

}  // namespace

std::optional<DataShape> PeekDataShape(const DataSpec& spec) {
  switch (spec.scheme) {
    case DataSpec::Scheme::kSynthetic:
      return DataShape{{{spec.sample_shape, "float32"}}, std::nullopt};
    case DataSpec::Scheme::kImages: {
      DataSpec filled = spec;
      FillImageNetDefaults(&filled);
      return DataShape{{{{3, filled.crop, filled.crop}, "float32"}}, std::nullopt};
    }
    case DataSpec::Scheme::kNpy:
      return NpyShape(spec.path);
    case DataSpec::Scheme::kSafetensors:
      return SafetensorsShape(spec.path, spec.keys);
    case DataSpec::Scheme::kTorch:
      return std::nullopt;
  }
  return std::nullopt;
}

absl::Status CheckDataShape(const ModelInputs& inputs, const DataSpec& spec, int64_t batch_size,
                            int64_t max_batches) {
  if (inputs.empty()) return absl::OkStatus();
  const std::optional<DataShape> shape = PeekDataShape(spec);
  if (!shape) return absl::OkStatus();
  const absl::Status fits = CheckData(inputs, *shape, batch_size, max_batches);
  if (fits.ok()) return fits;
  return absl::InvalidArgumentError(
      absl::StrCat("the data ", DataSpecToString(spec), " does not fit the model: ", fits.message()));
}

}  // namespace recal::data
