#include "recal/data.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data_source.h"
#include "common/data_spec.h"
#include "common/formats/npy.h"
#include "common/formats/safetensors.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"

namespace recal {

// The one spec parser (common/data_spec.h) is shared with the server's data layer, so a
// spec means the same thing to recal-run, recalctl and the server.
absl::StatusOr<v1::DataSource> DataSourceFromSpec(absl::string_view spec) {
  RECAL_ASSIGN_OR_RETURN(data::DataSpec parsed, data::ParseDataSpec(spec));
  v1::DataSource source;
  switch (parsed.scheme) {
    case data::DataSpec::Scheme::kSynthetic: {
      v1::SyntheticSource* synthetic = source.mutable_synthetic();
      for (int64_t d : parsed.sample_shape) synthetic->add_sample_shape(d);
      // int64 in the API: seeds of 2^63 and above travel bit for bit (the server casts back).
      synthetic->set_seed(static_cast<int64_t>(parsed.seed));
      return source;
    }
    case data::DataSpec::Scheme::kImages: {
      v1::ImageFolderSource* folder = source.mutable_image_folder();
      folder->set_path(parsed.path);
      folder->set_resize(parsed.resize);
      folder->set_crop(parsed.crop);
      for (double m : parsed.mean) folder->add_mean(static_cast<float>(m));
      for (double s : parsed.std) folder->add_std(static_cast<float>(s));
      folder->set_samples(parsed.samples > 0 ? parsed.samples : 0);
      folder->set_shuffle(parsed.shuffle);
      folder->set_seed(parsed.seed);
      folder->set_on_bad(parsed.skip_bad ? v1::ImageFolderSource::SKIP : v1::ImageFolderSource::FAIL);
      return source;
    }
    case data::DataSpec::Scheme::kNpy:
    case data::DataSpec::Scheme::kSafetensors:
    case data::DataSpec::Scheme::kTorch:
      break;
  }
  v1::TensorFileSource* file = source.mutable_tensor_file();
  file->set_path(parsed.path);
  file->set_format(parsed.scheme == data::DataSpec::Scheme::kNpy           ? v1::TensorFileSource::NPY
                   : parsed.scheme == data::DataSpec::Scheme::kSafetensors ? v1::TensorFileSource::SAFETENSORS
                                                                           : v1::TensorFileSource::TORCH);
  for (const std::string& key : parsed.keys) file->add_keys(key);
  file->set_scale(static_cast<float>(parsed.scale));
  for (double m : parsed.mean) file->add_mean(static_cast<float>(m));
  for (double s : parsed.std) file->add_std(static_cast<float>(s));
  return source;
}

std::string DataSourceToSpec(const v1::DataSource& source) {
  if (std::optional<data::DataSpec> spec = data::DataSpecOfSource(source)) return data::DataSpecToString(*spec);
  switch (source.source_case()) {
    case v1::DataSource::kClientStream:
      return "client_stream";
    case v1::DataSource::kTensorFile:
      return absl::StrCat("file:", source.tensor_file().path());  // no spec names a file of no format
    default:
      return "";
  }
}

absl::StatusOr<v1::DataSource> StreamSourceFromSpec(absl::string_view spec,
                                                    const v1::ClientStreamSource& normalisation) {
  RECAL_ASSIGN_OR_RETURN(const v1::DataSource named, DataSourceFromSpec(spec));
  v1::DataSource source;
  *source.mutable_client_stream() = normalisation;
  if (!named.has_tensor_file()) return source;  // LocalBatches::Open says why it cannot be streamed
  const v1::TensorFileSource& file = named.tensor_file();
  if (file.scale() == 0 && file.mean().empty()) return source;
  if (normalisation.scale() != 0 || !normalisation.mean().empty() || !normalisation.std().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", spec, "' names its normalisation (?scale=&mean=&std=) and a stream normalisation is given "
        "too; give one of them"));
  }
  v1::ClientStreamSource* stream = source.mutable_client_stream();
  stream->set_scale(file.scale());
  *stream->mutable_mean() = file.mean();
  *stream->mutable_std() = file.std();
  return source;
}

// ------------------------------------------------------------------------ LocalBatches

namespace client_internal {

// One positional input of a local file.
struct LocalInput {
  v1::Tensor::DType dtype = v1::Tensor::FLOAT32;
  std::vector<int64_t> shape;  // of the whole array
  int64_t sample_bytes = 0;    // bytes of one sample (dims after the first)
  absl::string_view bytes;     // the array's data in the mapping
};

}  // namespace client_internal

struct LocalBatches::State {
  using Input = client_internal::LocalInput;
  std::unique_ptr<data::MappedFile> file;
  std::vector<Input> inputs;
};

namespace {

using client_internal::LocalInput;

absl::StatusOr<v1::Tensor::DType> StreamableDType(formats::DType dtype, absl::string_view what) {
  switch (dtype) {
    case formats::DType::kF32:
      return v1::Tensor::FLOAT32;
    case formats::DType::kF16:
      return v1::Tensor::FLOAT16;
    case formats::DType::kU8:
      return v1::Tensor::UINT8;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is ", formats::DTypeName(dtype),
                       "; streamed data must be float32, float16 or uint8 (convert it first)"));
  }
}

absl::StatusOr<LocalInput> MakeInput(formats::DType dtype, const std::vector<int64_t>& shape,
                                     absl::string_view bytes, absl::string_view what) {
  LocalInput input;
  RECAL_ASSIGN_OR_RETURN(input.dtype, StreamableDType(dtype, what));
  if (shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is a scalar; batches are cut along dim 0"));
  }
  input.shape = shape;
  input.sample_bytes = formats::ElementSize(dtype);
  for (size_t i = 1; i < shape.size(); ++i) input.sample_bytes *= shape[i];
  input.bytes = bytes;
  return input;
}

}  // namespace

LocalBatches::LocalBatches(std::unique_ptr<State> state, int64_t num_samples, int64_t batch_size)
    : state_(std::move(state)), num_samples_(num_samples), batch_size_(batch_size) {}

LocalBatches::~LocalBatches() = default;

absl::StatusOr<std::unique_ptr<LocalBatches>> LocalBatches::Open(absl::string_view spec, int64_t batch_size) {
  if (batch_size < 1) return absl::InvalidArgumentError("batch size must be at least 1");
  RECAL_ASSIGN_OR_RETURN(data::DataSpec parsed, data::ParseDataSpec(spec));
  auto state = std::make_unique<State>();
  if (parsed.scheme == data::DataSpec::Scheme::kNpy) {
    RECAL_ASSIGN_OR_RETURN(state->file, data::MappedFile::Open(parsed.path));
    auto header = formats::ParseNpyFile(state->file->bytes());
    if (!header.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("'", parsed.path, "': ", header.status().message()));
    }
    RECAL_ASSIGN_OR_RETURN(State::Input input,
                           MakeInput(header->dtype, header->shape,
                                     state->file->bytes().substr(header->data_offset, header->data_size),
                                     absl::StrCat("the array in '", parsed.path, "'")));
    state->inputs.push_back(std::move(input));
  } else if (parsed.scheme == data::DataSpec::Scheme::kSafetensors) {
    RECAL_ASSIGN_OR_RETURN(state->file, data::MappedFile::Open(parsed.path));
    auto header = formats::ParseSafetensors(state->file->bytes());
    if (!header.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("'", parsed.path, "': ", header.status().message()));
    }
    std::vector<std::string> keys = parsed.keys;
    if (keys.empty()) {
      for (const auto& tensor : header->tensors) keys.push_back(tensor.name);
    }
    if (keys.empty()) return absl::InvalidArgumentError(absl::StrCat("'", parsed.path, "' holds no tensors"));
    for (const std::string& key : keys) {
      const formats::SafetensorsTensorInfo* info = header->Find(key);
      if (info == nullptr) {
        return absl::NotFoundError(absl::StrCat("'", parsed.path, "' has no tensor '", key, "'"));
      }
      const absl::string_view bytes =
          state->file->bytes().substr(header->data_offset + info->begin, info->end - info->begin);
      RECAL_ASSIGN_OR_RETURN(State::Input input,
                             MakeInput(info->dtype, info->shape, bytes,
                                       absl::StrCat("tensor '", key, "' in '", parsed.path, "'")));
      state->inputs.push_back(std::move(input));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot stream '", spec, "': local data must be npy:PATH or safetensors:PATH[:KEY,...]"));
  }
  const int64_t samples = state->inputs[0].shape[0];
  for (const State::Input& input : state->inputs) {
    if (input.shape[0] != samples) {
      return absl::InvalidArgumentError(absl::StrCat("the inputs in '", parsed.path,
                                                     "' hold different numbers of samples (dim 0): ", samples,
                                                     " and ", input.shape[0]));
    }
  }
  return std::unique_ptr<LocalBatches>(new LocalBatches(std::move(state), samples, batch_size));
}

absl::StatusOr<bool> LocalBatches::Next(std::vector<v1::Tensor>* inputs) {
  inputs->clear();
  if (next_sample_ >= num_samples_) return false;
  const int64_t count = std::min(batch_size_, num_samples_ - next_sample_);
  for (const State::Input& input : state_->inputs) {
    v1::Tensor tensor;
    tensor.set_dtype(input.dtype);
    tensor.add_shape(count);
    for (size_t i = 1; i < input.shape.size(); ++i) tensor.add_shape(input.shape[i]);
    const absl::string_view bytes =
        input.bytes.substr(next_sample_ * input.sample_bytes, count * input.sample_bytes);
    tensor.set_data(bytes.data(), bytes.size());
    inputs->push_back(std::move(tensor));
  }
  next_sample_ += count;
  return true;
}

}  // namespace recal
