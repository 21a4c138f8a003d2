#include "server/jobs/data_source_spec.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/data/data_roots.h"

namespace recal::jobs {

absl::StatusOr<std::string> DataSpecFor(const v1::DataSource& source,
                                        const std::vector<std::string>& data_roots) {
  switch (source.source_case()) {
    case v1::DataSource::kTensorFile: {
      const v1::TensorFileSource& file = source.tensor_file();
      auto path = data::ResolveUnderRoots(data_roots, file.path());
      if (!path.ok()) return path.status();
      switch (file.format()) {
        case v1::TensorFileSource::NPY:
          return absl::StrCat("npy:", *path);
        case v1::TensorFileSource::SAFETENSORS:
          // The trailing ':' keeps a ':' inside the path from being read as the key list.
          return absl::StrCat("safetensors:", *path, ":", absl::StrJoin(file.keys(), ","));
        case v1::TensorFileSource::TORCH:
          return absl::StrCat("torch:", *path);
        default:
          return absl::InvalidArgumentError("tensor_file.format must be NPY, SAFETENSORS or TORCH");
      }
    }
    case v1::DataSource::kSynthetic: {
      const v1::SyntheticSource& synthetic = source.synthetic();
      if (synthetic.sample_shape().empty()) {
        return absl::InvalidArgumentError("synthetic.sample_shape is empty");
      }
      for (int64_t d : synthetic.sample_shape()) {
        if (d <= 0) return absl::InvalidArgumentError("synthetic.sample_shape dims must be positive");
      }
      return absl::StrCat("synthetic:", absl::StrJoin(synthetic.sample_shape(), "x"),
                          ",seed=", synthetic.seed());
    }
    case v1::DataSource::kClientStream:
      return std::string(kClientStreamSpec);
    case v1::DataSource::kImageFolder:
      return absl::UnimplementedError("image_folder data sources are not served yet");
    default:
      return absl::InvalidArgumentError("the job spec names no data source");
  }
}

}  // namespace recal::jobs
