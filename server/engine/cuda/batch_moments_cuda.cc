// recal::merge_batch_moments for CUDA tensors: the checks, the workspace and the stream
// around the kernel (batch_moments_kernel.cu). Registered when librecal_engine_cuda.so loads,
// which the programs that run models on a GPU link (recal-worker, recal-run).
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include "server/engine/batch_moments.h"
#include "server/engine/cuda/batch_moments_kernel.h"

namespace recal::engine::cuda {
namespace {

InputType TypeOf(const at::Tensor& input) {
  switch (input.scalar_type()) {
    case at::kFloat: return InputType::kFloat;
    case at::kDouble: return InputType::kDouble;
    case at::kBFloat16: return InputType::kBFloat16;
    case at::kHalf: return InputType::kHalf;
    default: TORCH_CHECK(false, "merge_batch_moments: no kernel for ", input.scalar_type(), " inputs");
  }
}

// Each stream's workspace, grown when a call needs more and never shrunk: one allocation per
// growth (the first batch), none per call. Zeroed when made (the counters must start at 0);
// a replaced one is freed to the caching allocator, which hands it out again only after the
// work queued on the stream before.
class Workspaces {
 public:
  Workspace For(const at::Tensor& like, const c10::cuda::CUDAStream& stream, size_t partials, size_t counters) {
    const size_t doubles = partials + (counters + 1) / 2;
    std::lock_guard<std::mutex> lock(mu_);
    at::Tensor& buffer = buffers_[{like.device().index(), stream.id()}];
    if (!buffer.defined() || static_cast<size_t>(buffer.numel()) < doubles) {
      buffer = at::zeros({static_cast<int64_t>(doubles)}, like.options().dtype(at::kDouble));
    }
    double* base = buffer.data_ptr<double>();
    return {base, reinterpret_cast<unsigned int*>(base + partials)};
  }

 private:
  std::mutex mu_;
  std::map<std::pair<int, c10::StreamId>, at::Tensor> buffers_;
};

Workspaces& TheWorkspaces() {
  static Workspaces* workspaces = new Workspaces();  // outlives every call, also at exit
  return *workspaces;
}

void CheckArguments(const at::Tensor& input, const at::Tensor& accumulators, const at::Tensor& mean,
                    const at::Tensor& invstd, const at::Tensor& nonfinite) {
  const int64_t channels = input.size(1);
  TORCH_CHECK(input.dim() >= 2 && input.numel() / channels >= 1, "merge_batch_moments: no values per channel");
  TORCH_CHECK(accumulators.scalar_type() == at::kDouble && accumulators.is_contiguous() &&
                  accumulators.size(0) == kAccumulatorRows && accumulators.size(1) == channels,
              "merge_batch_moments: accumulators must be float64 [", kAccumulatorRows, ", ", channels, "]");
  const at::ScalarType stats = input.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  for (const at::Tensor* t : {&mean, &invstd}) {
    TORCH_CHECK(t->scalar_type() == stats && t->is_contiguous() && t->numel() == channels,
                "merge_batch_moments: mean and invstd must be ", stats, " [", channels, "]");
  }
  TORCH_CHECK(nonfinite.scalar_type() == at::kBool && nonfinite.numel() == 1, "merge_batch_moments: nonfinite is a bool");
  for (const at::Tensor* t : {&accumulators, &mean, &invstd, &nonfinite}) {
    TORCH_CHECK(t->device() == input.device(), "merge_batch_moments: every tensor on ", input.device());
  }
}

void MergeBatchMomentsCuda(const at::Tensor& input, const at::Tensor& accumulators, double population,
                           double calls_with_variance, double eps, const at::Tensor& mean, const at::Tensor& invstd,
                           const at::Tensor& nonfinite) {
  CheckArguments(input, accumulators, mean, invstd, nonfinite);
  const c10::cuda::CUDAGuard guard(input.device());
  const SamplesChannelsPositions x = AsSamplesChannelsPositions(input);
  BatchMomentsCall call;
  call.input = x.view.data_ptr();
  call.type = TypeOf(input);
  call.samples = x.view.size(0);
  call.channels = x.view.size(1);
  call.positions = x.view.size(2);
  call.channels_innermost = x.channels_innermost;
  call.sample_stride = x.view.stride(0);
  call.channel_stride = x.view.stride(1);
  call.accumulators = accumulators.data_ptr<double>();
  call.mean = mean.data_ptr();
  call.invstd = invstd.data_ptr();
  call.stats_double = mean.scalar_type() == at::kDouble;
  call.nonfinite = nonfinite.data_ptr<bool>();
  call.population = population;
  call.calls_with_variance = calls_with_variance;
  call.eps = eps;
  const Grid grid = PlanGrid(call, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  TORCH_CHECK(grid.channel_blocks <= 65535, "merge_batch_moments: ", call.channels, " channels are more than it takes");
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream();
  const Workspace workspace = TheWorkspaces().For(input, stream, PartialSums(call, grid), CounterCount(grid));
  const int error = LaunchBatchMoments(call, grid, workspace, stream.stream());
  TORCH_CHECK(error == 0, "merge_batch_moments: the CUDA kernel did not start: ",
              cudaGetErrorString(static_cast<cudaError_t>(error)));
}

}  // namespace

TORCH_LIBRARY_IMPL(recal, CUDA, m) { m.impl("merge_batch_moments", TORCH_FN(MergeBatchMomentsCuda)); }

}  // namespace recal::engine::cuda
