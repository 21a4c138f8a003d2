#include "server/engine/observed_model.h"

#include "common/status_macros.h"
#include "server/engine/exported/exported_model.h"
#include "server/engine/script_model.h"

namespace recal::engine {

absl::StatusOr<std::unique_ptr<ObservedModel>> LoadObservedModel(const std::string& path, const LoadOptions& options) {
  RECAL_ASSIGN_OR_RETURN(std::shared_ptr<ReadAdapter> file, OpenModelFile(path));
  RECAL_ASSIGN_OR_RETURN(ModelFormat format, DetectModelFormat(file));
  if (format == ModelFormat::kExportedProgram) return exported::LoadExportedModel(std::move(file), options);
  return LoadScriptModel(std::move(file), path, options);
}

}  // namespace recal::engine
