#include "server/jobs/job_plan.h"

#include "absl/strings/str_cat.h"
#include "common/data_source.h"
#include "common/enum_names.h"
#include "common/report_facts.h"
#include "common/request_limits.h"
#include "common/status_macros.h"
#include "server/data_access/data_shape.h"
#include "server/jobs/resolved_data_source.h"

namespace recal::jobs {
namespace {

// E's value named `name` ("" is E's unspecified value: the engine's default), or
// INVALID_ARGUMENT listing the names.
template <typename E>
absl::StatusOr<E> NamedValue(absl::string_view field, const std::string& name) {
  if (name.empty()) return static_cast<E>(0);
  if (std::optional<E> value = EnumFromName<E>(name)) return *value;
  return absl::InvalidArgumentError(absl::StrCat(field, " '", name, "': use ", EnumNameList<E>()));
}

// Proto3 enums are open: a number no value has arrives as it was sent.
template <typename E>
absl::Status CheckDeclared(absl::string_view field, E value) {
  if (google::protobuf::GetEnumDescriptor<E>()->FindValueByNumber(static_cast<int>(value)) != nullptr) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", static_cast<int>(value), ", which is none of ", EnumNameList<E>()));
}

absl::StatusOr<worker::v1::EnginePlan> PlanEngine(const v1::EngineOptions& options) {
  if (options.max_batches() < 0) return absl::InvalidArgumentError("options.max_batches < 0");
  if (options.target_rel_error() < 0) return absl::InvalidArgumentError("options.target_rel_error < 0");
  RECAL_RETURN_IF_ERROR(CheckDeclared("options.estimator", options.estimator()));
  RECAL_RETURN_IF_ERROR(CheckDeclared("options.modules", options.modules()));
  worker::v1::EnginePlan plan;
  plan.set_estimator(options.estimator());
  plan.set_modules(options.modules());
  plan.set_include(options.include());
  plan.set_exclude(options.exclude());
  plan.set_max_batches(options.max_batches());
  plan.set_allow_short_data(options.allow_short_data());
  plan.set_target_rel_error(options.target_rel_error());
  RECAL_ASSIGN_OR_RETURN(const v1::ComputeDtype dtype,
                         NamedValue<v1::ComputeDtype>("options.compute_dtype", options.compute_dtype()));
  plan.set_compute_dtype(dtype);
  RECAL_ASSIGN_OR_RETURN(const v1::MemoryFormat format,
                         NamedValue<v1::MemoryFormat>("options.memory_format", options.memory_format()));
  plan.set_memory_format(format);
  plan.set_iterations(options.iterations());
  plan.set_fold_batch_norm(options.fold_batch_norm());
  return plan;
}

// Passes over the data: the worker reads it again for each, so it must be data the worker
// can read again, whole, in one task.
absl::Status CheckIterations(const v1::JobSpec& spec) {
  const int32_t iterations = spec.options().iterations();
  if (iterations < 0 || iterations > limits::kMaxIterations) {
    return absl::InvalidArgumentError(absl::StrCat("options.iterations is ", iterations, ": give 1 to ",
                                                   limits::kMaxIterations, " (0: one pass)"));
  }
  if (iterations <= 1) return absl::OkStatus();
  if (spec.data().has_client_stream()) {
    return absl::InvalidArgumentError(
        "options.iterations > 1 reads the data once per pass, and a client stream is pushed once: give data the "
        "server reads, or run one job per pass with the statistics of the one before loaded into the model "
        "(recal.torch.recalibrate(..., iterations=K) does)");
  }
  if (spec.shards() > 1) {
    return absl::InvalidArgumentError("options.iterations > 1 with shards: each pass needs the statistics of the "
                                      "whole data before the next starts; give one or the other");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<worker::v1::JobPlan> PlanJob(const v1::JobSpec& spec, const std::vector<std::string>& data_roots) {
  worker::v1::JobPlan plan;
  plan.set_model_id(spec.model_id());
  plan.set_batch_size(spec.batch_size());
  RECAL_RETURN_IF_ERROR(CheckIterations(spec));
  RECAL_ASSIGN_OR_RETURN(*plan.mutable_engine(), PlanEngine(spec.options()));
  RECAL_ASSIGN_OR_RETURN(*plan.mutable_data(), ResolveDataSource(spec.data(), data_roots));
  return plan;
}

absl::Status CheckPlanFitsModel(const worker::v1::JobPlan& plan, const v1::Model& model) {
  // The inspection marks TorchScript's inputs any_shape (an exported program declares them);
  // a model stored before contracts were read says nothing, and its worker refuses instead.
  const bool torchscript = !model.inputs().empty() && model.inputs(0).any_shape();
  if (plan.engine().fold_batch_norm() && torchscript) {
    return absl::FailedPreconditionError(absl::StrCat("options.fold_batch_norm: model ", model.id(),
                                                      " is TorchScript; ", kFoldNeedsExportedProgram,
                                                      "; or submit without fold_batch_norm"));
  }
  const std::optional<data::DataSpec> data = data::DataSpecOfSource(plan.data());
  if (!data) return absl::OkStatus();  // a client stream: its batches are checked as they come
  const int64_t max_batches = plan.engine().max_batches() > 0 ? plan.engine().max_batches() : data::kDefaultMaxBatches;
  return data::CheckDataShape(model.inputs(), *data, plan.batch_size(), max_batches);
}

const std::string& DataPath(const v1::DataSource& source) {
  static const std::string* const kNone = new std::string();
  if (source.has_tensor_file()) return source.tensor_file().path();
  if (source.has_image_folder()) return source.image_folder().path();
  return *kNone;
}

}  // namespace recal::jobs
