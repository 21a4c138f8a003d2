// An image file in an image folder (images:DIR?...), through the project's own code path
// (server/data/image_source.cc): the file read, JPEG/PNG sniffed, decoded with libjpeg-turbo
// (TurboJPEG) or libpng as PIL would, converted to RGB, resized with Pillow's resampling
// (server/data/pil_resample.cc), center-cropped and normalised into a batch. The input is
// the file's bytes; the resize and crop sizes vary with its length.
//
// Contract: a file that is not a whole JPEG/PNG fails the batch with INVALID_ARGUMENT naming
// the file; one that decodes gives a [1, 3, crop, crop] float32 batch of pixels in [0, 1]
// (mean 0, std 1), never a read outside the file or the image.
#include <cmath>
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include "absl/strings/match.h"
#include "common/data_spec.h"
#include "fuzz/fuzz_util.h"
#include "server/data/image_source.h"

namespace {

const std::string& Folder() {
  static const std::string folder = [] {
    std::string dir = recal::fuzz::ScratchDir() + "/images";
    std::filesystem::create_directories(dir);
    return dir;
  }();
  return folder;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  Folder();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  recal::fuzz::WriteFileOrDie(Folder() + "/a.png", absl::string_view(reinterpret_cast<const char*>(data), size));
  recal::data::DataSpec spec;
  spec.scheme = recal::data::DataSpec::Scheme::kImages;
  spec.path = Folder();
  spec.resize = 4 + static_cast<int64_t>(size % 29);             // 4..32: down- and upscaling
  spec.crop = spec.resize - static_cast<int64_t>(size / 29 % 4);  // crops of 0..3 pixels
  spec.mean = {0, 0, 0};
  spec.std = {1, 1, 1};
  recal::data::ImageSourceOptions options;
  options.threads = 1;
  auto source = recal::data::OpenImageSource(spec, /*batch_size=*/1, options);
  FUZZ_CHECK(source.ok(), "OpenImageSource: ", source.status().ToString());
  auto batch = (*source)->Next();
  if (!batch.ok()) {
    recal::fuzz::CheckRefusal(batch.status(), "decoding");
    FUZZ_CHECK(batch.status().code() == absl::StatusCode::kInvalidArgument, batch.status().ToString());
    FUZZ_CHECK(absl::StrContains(batch.status().message(), "a.png"), "the error does not name the file: ",
               batch.status().message());
    return 0;
  }
  FUZZ_CHECK(batch->has_value() && (*batch)->size() == 1, "one batch of one input");
  const at::Tensor& t = (**batch)[0];
  const int64_t c = spec.crop;
  FUZZ_CHECK(t.scalar_type() == at::kFloat && t.dim() == 4 && t.size(0) == 1 && t.size(1) == 3 && t.size(2) == c &&
                 t.size(3) == c,
             "batch shape");
  const float* values = t.data_ptr<float>();
  for (int64_t i = 0; i < 3 * c * c; ++i) {
    FUZZ_CHECK(values[i] >= 0.0f && values[i] <= 1.0f, "pixel value ", values[i], " at ", i);
  }
  auto end = (*source)->Next();
  FUZZ_CHECK(end.ok() && !end->has_value(), "one file, one sample");
  return 0;
}
