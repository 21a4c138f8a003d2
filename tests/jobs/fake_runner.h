// A JobRunner without a model or a worker process, for the tests of what runs jobs: each
// test says what a run does (progress, files left in scratch, failure, waiting for cancel).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/input_contract.h"
#include "common/sha256.h"
#include "server/jobs/job_runner.h"
#include "server/jobs/model_inspector.h"
#include "server/jobs/model_registry.h"
#include "tests/test_util.h"

namespace recal::jobs {

class FakeRunner : public JobRunner, public ModelInspector {
 public:
  std::function<absl::StatusOr<v1::RunReport>(const RecalibrationTask&, const RunHooks&)> recalibrate;

  absl::StatusOr<v1::RunReport> Recalibrate(const RecalibrationTask& task, const RunHooks& hooks) override {
    return recalibrate(task, hooks);
  }
  // Runs first in every Inspect (e.g. blocks, or answers as a full host would); null: none.
  std::function<absl::Status()> before_inspect;
  // The input contract every inspected model has (none: no check at submit).
  ModelInputs inputs;

  // Runs in Reserve (answers as a full host would); null: room is given.
  std::function<absl::Status()> reserve;

  absl::StatusOr<std::unique_ptr<Room>> Reserve(int64_t archive_bytes) override {
    if (reserve) {
      if (absl::Status status = reserve(); !status.ok()) return status;
    }
    return ModelInspector::Reserve(archive_bytes);
  }

  absl::StatusOr<v1::Model> Inspect(const std::string&) override {
    if (before_inspect) {
      if (absl::Status status = before_inspect(); !status.ok()) return status;
    }
    v1::Model model;
    model.add_layers()->set_name("bn");
    *model.mutable_inputs() = inputs;
    return model;
  }
};

// What a worker leaves in scratch when it succeeds.
inline void WriteResults(const RecalibrationTask& task) {
  for (const char* name : {"model.pt", "bn.safetensors", "report.json"}) {
    testing::WriteBytes((std::filesystem::path(task.scratch_dir) / name).string(), std::string("bytes of ") + name);
  }
}

// Uploads `bytes` as a model named `name` (the fake runner inspects nothing) and returns its id.
inline std::string UploadAnyModel(ModelRegistry& models, const std::string& tenant = "t",
                                  const std::string& bytes = "a model archive", const std::string& name = "m") {
  v1::UploadHeader header;
  header.set_name(name);
  header.set_size(bytes.size());
  header.set_sha256(Sha256Hex(bytes));
  absl::StatusOr<std::optional<v1::Model>> started = models.StartUpload(tenant, header);
  if (!started.ok()) return "";
  if (started->has_value()) return (*started)->id();  // the tenant has these bytes: nothing to send
  v1::UploadChunk chunk;
  chunk.set_data(bytes);
  if (!models.AppendChunk(tenant, header, chunk).ok()) return "";
  auto model = models.FinishUpload(tenant, header);
  return model.ok() ? model->id() : "";
}

}  // namespace recal::jobs
