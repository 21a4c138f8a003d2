// images:DIR?resize=R&crop=C&mean=..&std=..[&samples=N&seed=S&shuffle=0|1&on_bad=fail|skip]
// Every .jpg/.jpeg/.png (case-insensitive) under DIR, recursively (following links to
// directories, each directory entered once), in sorted relative-path
// order (or a seeded shuffle of it), the first N. Each image goes through torchvision's
// ImageFolder eval pipeline: PIL convert("RGB") (alpha dropped, gray/palette/CMYK expanded),
// Resize(R) (bilinear, antialiased), CenterCrop(C), ToTensor, Normalize(mean, std), giving
// float32 [N,3,C,C] batches, bit for bit what torchvision gives (same libjpeg-turbo decode,
// Pillow's fixed-point resampling reproduced). Files are decoded on a pool of threads ahead
// of the reader; the output does not depend on the thread count. A corrupt file or
// non-image fails that batch's Next() with INVALID_ARGUMENT naming the file (on_bad=fail) or
// is skipped and counted in skipped_files() (on_bad=skip; later files fill the batch,
// num_samples() still counts it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data_spec.h"
#include "server/data/batch_source.h"

namespace recal::data {

struct ImageSourceOptions {
  int threads = 0;  // decoding threads; 0 = hardware concurrency, at most 8
  // Decode JPEGs at the smallest n/8 DCT scale whose shorter side is still >= R (faster,
  // but no longer pixel-identical to torchvision's PIL pipeline).
  bool jpeg_dct_scaling = false;
  // Not empty (the server's data roots): every file, links resolved, must lie under one of
  // them, or reading it fails with PERMISSION_DENIED (whatever on_bad says).
  std::vector<std::string> allowed_roots;
};

absl::StatusOr<std::unique_ptr<BatchSource>> OpenImageSource(const DataSpec& spec, int64_t batch_size,
                                                             ImageSourceOptions options = {});

// The folder behind OpenImageSource, wherever its files live (a local directory, a prefix
// in a bucket: s3_sources.cc). Which files it uses and in which order are the rules of
// server/data_access/image_files.h, the same for every folder.

// One file's bytes by its path relative to the folder; called from the decoding threads at
// once. NOT_FOUND, PERMISSION_DENIED, UNAVAILABLE, ... fail the batch whatever on_bad says;
// only undecodable bytes (INVALID_ARGUMENT, from the decoder) are "bad files".
using ImageFileReader = std::function<absl::StatusOr<std::string>(const std::string& relative)>;

// The source over `files` (relative paths with '/' separators, as listed, any order), in
// the order SelectImageFiles (image_files.h) gives them, read with `read` by the decoding threads at most a window ahead of Next() (the reads of
// a bucket's objects are concurrent and bounded, like the decoding), decoded as above.
// NOT_FOUND naming `where` if no file is left.
absl::StatusOr<std::unique_ptr<BatchSource>> MakeImageSource(const DataSpec& spec, std::vector<std::string> files,
                                                             ImageFileReader read, const std::string& where,
                                                             int64_t batch_size, ImageSourceOptions options);

}  // namespace recal::data
