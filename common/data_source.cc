#include "common/data_source.h"

#include <vector>

namespace recal::data {
namespace {

template <typename Floats>
std::vector<double> Decimals(const Floats& values) {
  std::vector<double> out;
  for (float v : values) out.push_back(FloatAsDecimal(v));
  return out;
}

}  // namespace

std::optional<DataSpec> DataSpecOfSource(const v1::DataSource& source) {
  DataSpec spec;
  switch (source.source_case()) {
    case v1::DataSource::kTensorFile: {
      const v1::TensorFileSource& file = source.tensor_file();
      switch (file.format()) {
        case v1::TensorFileSource::NPY:
          spec.scheme = DataSpec::Scheme::kNpy;
          break;
        case v1::TensorFileSource::SAFETENSORS:
          spec.scheme = DataSpec::Scheme::kSafetensors;
          break;
        case v1::TensorFileSource::TORCH:
          spec.scheme = DataSpec::Scheme::kTorch;
          break;
        default:
          return std::nullopt;
      }
      spec.path = file.path();
      spec.keys.assign(file.keys().begin(), file.keys().end());
      spec.scale = FloatAsDecimal(file.scale());
      spec.mean = Decimals(file.mean());
      spec.std = Decimals(file.std());
      return spec;
    }
    case v1::DataSource::kImageFolder: {
      const v1::ImageFolderSource& folder = source.image_folder();
      spec.scheme = DataSpec::Scheme::kImages;
      spec.path = folder.path();
      spec.resize = folder.resize();
      spec.crop = folder.crop();
      spec.mean = Decimals(folder.mean());
      spec.std = Decimals(folder.std());
      spec.samples = folder.samples() > 0 ? folder.samples() : -1;
      spec.shuffle = folder.shuffle();
      spec.seed = folder.seed();
      spec.skip_bad = folder.on_bad() == v1::ImageFolderSource::SKIP;
      FillImageNetDefaults(&spec);
      return spec;
    }
    case v1::DataSource::kSynthetic:
      spec.scheme = DataSpec::Scheme::kSynthetic;
      spec.sample_shape.assign(source.synthetic().sample_shape().begin(), source.synthetic().sample_shape().end());
      // int64 in the API, uint64 in specs: clients store a spec's seed bit for bit
      // (DataSourceFromSpec), so the cast back gives the seed they were given.
      spec.seed = static_cast<uint64_t>(source.synthetic().seed());
      return spec;
    default:
      return std::nullopt;
  }
}

v1::ImageFolderSource WithImageNetDefaults(v1::ImageFolderSource folder) {
  v1::DataSource source;
  *source.mutable_image_folder() = folder;
  const DataSpec spec = *DataSpecOfSource(source);
  folder.set_resize(spec.resize);
  folder.set_crop(spec.crop);
  folder.mutable_mean()->Assign(spec.mean.begin(), spec.mean.end());
  folder.mutable_std()->Assign(spec.std.begin(), spec.std.end());
  return folder;
}

}  // namespace recal::data
