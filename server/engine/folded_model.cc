#include "server/engine/folded_model.h"

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/report_facts.h"
#include "recal/v1/report.pb.h"
#include "common/status_macros.h"
#include "server/engine/exported/fold_batch_norm.h"
#include "server/engine/exported/pt2_archive.h"
#include "server/engine/model_file.h"

namespace recal::engine {

absl::StatusOr<FoldedModel> FoldBatchNorms(const std::string& path) {
  RECAL_ASSIGN_OR_RETURN(std::shared_ptr<ReadAdapter> file, OpenModelFile(path));
  RECAL_ASSIGN_OR_RETURN(const ModelFormat format, DetectModelFormat(file));
  if (format != ModelFormat::kExportedProgram) return absl::FailedPreconditionError(kFoldNeedsExportedProgram);
  RECAL_ASSIGN_OR_RETURN(const exported::Pt2Archive archive, exported::Pt2Archive::Read(file, {}));
  return exported::FoldProgramBatchNorms(archive);
}

absl::Status WriteFoldedModel(const std::string& model_path, const std::string& folded_path, v1::RunReport* report) {
  RECAL_ASSIGN_OR_RETURN(const FoldedModel folded, FoldBatchNorms(model_path));
  RECAL_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Open(folded_path));
  RECAL_RETURN_IF_ERROR(writer.Append(folded.bytes));
  RECAL_RETURN_IF_ERROR(writer.Commit());
  *report->mutable_fold() = FoldReport(folded);
  return absl::OkStatus();
}

v1::BatchNormFold FoldReport(const FoldedModel& folded) {
  v1::BatchNormFold report;
  for (const std::string& name : folded.folded) report.add_folded(name);
  for (const KeptBatchNorm& layer : folded.kept) {
    v1::BatchNormFold::Kept* kept = report.add_kept();
    kept->set_name(layer.name);
    kept->set_reason(layer.reason);
  }
  return report;
}

}  // namespace recal::engine
