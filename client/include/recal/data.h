// Data for recalibration jobs, as the client names it.
//
// Server-side data is one spec string, the same syntax recal-run takes (paths are the
// server's, relative to its --data_root directories or absolute):
//   npy:PATH[?NORM]
//   safetensors:PATH[:KEY,KEY...][?NORM]   several keys = several positional inputs
//   torch:PATH[?NORM]
//     NORM = scale=S&mean=M,M,..&std=S,S,.. (each optional; mean and std together, one
//     value per channel of dim 1): the server turns uint8 / float16 inputs into float32
//     (x / S - mean) / std, e.g. npy:calib/u8.npy?scale=255&mean=0.485,0.456,0.406&std=0.229,0.224,0.225
//   synthetic:SHAPE[,seed=S]                e.g. synthetic:3x224x224,seed=1
//   images:DIR[?resize=R&crop=C&mean=M,M,M&std=S,S,S&samples=N&seed=S&shuffle=0|1&on_bad=fail|skip]
//     every .jpg/.jpeg/.png under DIR (recursively) through torchvision's eval transform
//     (Resize(R), CenterCrop(C), ToTensor, Normalize(mean, std)); the first N files (all by
//     default) in sorted order, or shuffled with seed S; on_bad=skip skips corrupt files
//     instead of failing the job. 1 <= C <= R <= 65536; 3 means, 3 positive stds.
// Options start at the last '?': a PATH containing '?' needs a trailing '?'
// ("npy:/d/what?.npy?"); a DIR may contain '?' as it is (its options follow it).
//
// Local data (npy: or safetensors: on this machine, float32 / float16 / uint8) is read
// here, memory-mapped, and sliced along dim 0 into batches for PushBatches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "recal/v1/recal.pb.h"

namespace recal {

// The typed DataSource of a spec: TensorFileSource (with its scale/mean/std), SyntheticSource
// or ImageFolderSource. INVALID_ARGUMENT with the expected syntax otherwise.
absl::StatusOr<v1::DataSource> DataSourceFromSpec(absl::string_view spec);

// The canonical spec string of a DataSource ("client_stream" for pushed data), for display;
// DataSourceFromSpec of it gives the source back.
std::string DataSourceToSpec(const v1::DataSource& source);

// The client_stream source for pushing the local file `spec` names (LocalBatches): the
// spec's own ?scale=&mean=&std= if it has them, else `normalisation`, so a spec's
// normalisation is applied whether the server reads the file or the client streams it.
// INVALID_ARGUMENT for a malformed spec, or when both the spec and `normalisation` give one.
absl::StatusOr<v1::DataSource> StreamSourceFromSpec(absl::string_view spec,
                                                    const v1::ClientStreamSource& normalisation);

// A local .npy or .safetensors file cut into batches of `batch_size` samples (the last
// one may be shorter). The file is mapped, not read whole; it must not change meanwhile.
// Each batch travels as one gRPC message: keep it under the server's --max_message_bytes
// (8 MiB by default), or the push fails with RESOURCE_EXHAUSTED.
class LocalBatches {
 public:
  // `spec`: npy:PATH or safetensors:PATH[:KEY,KEY...] (no keys: every tensor, sorted by
  // name). INVALID_ARGUMENT for other schemes, dtypes other than float32 / float16 /
  // uint8, scalars, or inputs whose first dims differ; NOT_FOUND for a missing file.
  static absl::StatusOr<std::unique_ptr<LocalBatches>> Open(absl::string_view spec, int64_t batch_size);
  ~LocalBatches();

  int64_t num_samples() const { return num_samples_; }
  int64_t num_batches() const { return (num_samples_ + batch_size_ - 1) / batch_size_; }

  // The next batch's inputs; false after the last one.
  absl::StatusOr<bool> Next(std::vector<v1::Tensor>* inputs);

 private:
  struct State;  // the mapping and where each input lies in it
  LocalBatches(std::unique_ptr<State> state, int64_t num_samples, int64_t batch_size);

  std::unique_ptr<State> state_;
  int64_t num_samples_ = 0;
  int64_t batch_size_ = 1;
  int64_t next_sample_ = 0;
};

}  // namespace recal
