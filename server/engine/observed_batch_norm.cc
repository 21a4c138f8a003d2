// Registered when librecal_engine.so loads: a TORCH_LIBRARY in a static library would be
// dropped by the linker, which is why the engine is a shared library.
#include "server/engine/observed_batch_norm.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include "server/engine/collector.h"

namespace recal::engine {
namespace {

at::Tensor ObservedBatchNorm(const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                             const c10::optional<at::Tensor>& bias,
                             const c10::optional<at::Tensor>& running_mean,
                             const c10::optional<at::Tensor>& running_var, bool training,
                             double momentum, double eps, bool cudnn_enabled, int64_t collector) {
  if (!running_mean || !running_mean->defined() || !running_var || !running_var->defined()) {
    // No running statistics to recalibrate: behave exactly like aten::batch_norm.
    return at::batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps,
                          cudnn_enabled);
  }
  return reinterpret_cast<Collector*>(collector)->Observe(
      input, weight, bias, *running_mean, *running_var, training, momentum, eps,
      cudnn_enabled);
}

}  // namespace

TORCH_LIBRARY(recal, m) {
  // CONSERVATIVE: the op has a side effect (it records statistics), so the JIT must neither
  // drop nor reorder it.
  m.def(torch::schema("recal::observed_batch_norm(Tensor input, Tensor? weight, Tensor? bias, "
                      "Tensor? running_mean, Tensor? running_var, bool training, float momentum, "
                      "float eps, bool cudnn_enabled, int collector) -> Tensor",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        TORCH_FN(ObservedBatchNorm));
}

}  // namespace recal::engine
