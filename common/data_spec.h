// Data specs name a source in one string, as clients send them:
//   npy:PATH[?NORM]
//   safetensors:PATH[:KEY,KEY...][?NORM]
//                                   no keys: every tensor, sorted by name. The keys start
//                                   after the last ':', so a PATH containing ':' needs a
//                                   trailing ':' ("safetensors:/a:b.st:" = all of /a:b.st).
//   torch:PATH[?NORM]               a torch.save'd tensor, or a list/tuple of tensors
//     NORM = scale=S&mean=M,M,..&std=S,S,.. (each optional; mean and std together, one value
//     per channel of dim 1): uint8 and float16 inputs become float32 (x / S - mean) / std.
//     Options start at the last '?', so a PATH containing '?' needs a trailing '?'.
//   synthetic:SHAPE[,seed=S]        SHAPE per sample, e.g. 3x224x224; S defaults to 0
//   images:DIR[?resize=R&crop=C&mean=m0,m1,m2&std=s0,s1,s2&samples=N&seed=S&shuffle=0|1&on_bad=fail|skip]
//                                   every .jpg/.jpeg/.png under DIR (recursive), sorted by
//                                   relative path (or shuffled with seed S), the first N;
//                                   torchvision eval transform; needs 1 <= C <= R; what is
//                                   left out is ImageNet's (FillImageNetDefaults). The
//                                   options start at the last '?', so a DIR containing '?'
//                                   needs a trailing '?'.
// PATH and DIR may be s3://BUCKET/KEY and s3://BUCKET/PREFIX/ (npy, safetensors, images):
// the ':' of "s3://" is part of the path, never the one before safetensors keys. Where
// such paths are read from, and which are refused, is the server's: server/data_access/s3_paths.h.
// Options are KEY=VALUE joined by '&', each KEY at most once; empty ones ("DIR?", "a&&b") are
// ignored. Numbers (scale, mean, std) are finite decimals such as 255, -0.5, .5 or 2e-3 (no
// spaces, no hexadecimal, no inf or nan); integers (sides, N, seeds, dims) are digits only.
// Parsing only checks the syntax; the files are looked at when the source is opened.
// The Python client parses the same grammar (client/python/recal/specs.py); both are tested
// against one table of cases, tests/data/data_spec_cases.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recal::data {

struct DataSpec {
  enum class Scheme { kNpy, kSafetensors, kTorch, kSynthetic, kImages };
  Scheme scheme = Scheme::kNpy;
  std::string path;                   // file schemes
  std::vector<std::string> keys;      // safetensors; empty = all tensors
  std::vector<int64_t> sample_shape;  // synthetic
  uint64_t seed = 0;                  // synthetic, images (shuffle seed)
  // images: DIR is `path`.
  int64_t resize = 0;                 // shorter side after resizing
  int64_t crop = 0;                   // center crop size
  std::vector<double> mean, std;      // images: 3 each; file schemes: per channel or none
  double scale = 0;                   // file schemes: divide uint8/float16 inputs by it (0: 1)
  int64_t samples = -1;               // -1 = all
  bool shuffle = false;
  bool skip_bad = false;              // on_bad=skip (default fail)
};

// INVALID_ARGUMENT with the offending spec quoted and the expected syntax.
absl::StatusOr<DataSpec> ParseDataSpec(absl::string_view spec);

// How many times ParseDataSpec ran in this process. A job's data travels typed from the RPC
// to its batch source (server/jobs/job_plan.h); tests count that none of it is text parsed.
int64_t ParseDataSpecCount();

// The canonical spelling (e.g. what Describe() starts with). Numbers are spelled so that
// they parse back to the same doubles.
std::string DataSpecToString(const DataSpec& spec);

// The double an API float (a mean, std or scale of recal.v1) stands for: the shortest
// decimal that reads back as the same float, so 0.485f becomes 0.485 and a spec built
// from a message spells 0.485, not 0.48500001430511475.
double FloatAsDecimal(float value);

// torchvision's ImageNet evaluation transform: Resize(256), CenterCrop(224), ImageNet's mean
// and std. An image folder gets what its spec (or ImageFolderSource) leaves out: a resize
// without a crop crops 224/256 of it, a crop without a resize resizes to 256/224 of it (the
// crop fraction 0.875 of timm and torchvision's references), mean and std each ImageNet's.
inline constexpr int64_t kMaxImageSide = 65536;  // the largest resize (and so crop) a spec may ask
inline constexpr int64_t kImageNetResize = 256;
inline constexpr int64_t kImageNetCrop = 224;
inline constexpr double kImageNetMean[3] = {0.485, 0.456, 0.406};
inline constexpr double kImageNetStd[3] = {0.229, 0.224, 0.225};
// Fills resize, crop (0: unset), mean and std (empty: unset) of an images spec.
void FillImageNetDefaults(DataSpec* spec);

// The batches a run uses when it does not say (fvcore's default for precise BN), fewer if the
// data ends first: the engine's, and what the server's admission expects the engine to do.
inline constexpr int64_t kDefaultMaxBatches = 200;

// The refusal of data shorter than the max_batches a run asked for, with both ways out and
// the names they have in each client.
absl::Status ShortDataError(int64_t batches, int64_t samples, int64_t max_batches);

}  // namespace recal::data
