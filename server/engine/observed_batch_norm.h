// The operator that replaces aten::batch_norm in an observed model.
#pragma once

namespace recal::engine {

// recal::observed_batch_norm(<the arguments of aten::batch_norm>, int collector) -> Tensor.
// `collector` is the address of the job's Collector, a constant the rewrite inserts, so
// concurrent jobs never share state and no global registry is consulted per call.
inline constexpr char kObservedBatchNormOp[] = "recal::observed_batch_norm";

// The namespace of every Recal operator: a saved model must reference none of them.
inline constexpr char kRecalOpNamespace[] = "recal";

}  // namespace recal::engine
