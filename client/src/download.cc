// Download: resume from the bytes already written, verify, then rename into place.
#include "client/src/client_impl.h"
#include "common/atomic_file.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace recal {

absl::StatusOr<DownloadResult> Client::Download(const std::string& job_id, v1::Artifact artifact,
                                                const std::string& path,
                                                const TransferCallback& on_progress) {
  // Bytes go to a temporary file next to `path`; an error anywhere below drops it and
  // leaves `path` as it was.
  RECAL_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Open(path));
  Sha256 hash;
  DownloadResult result;
  result.path = path;
  std::string announced;  // the digest the server sends with the first chunk of each stream
  int64_t offset = 0;
  int64_t total = -1;
  client_internal::ReconnectBudget budget(options_);
  while (true) {
    grpc::ClientContext context;
    impl_->Prepare(&context, /*unary=*/false);
    v1::DownloadResultRequest request;
    request.set_job_id(job_id);
    request.set_artifact(artifact);
    request.set_offset(offset);
    auto reader = impl_->stub->DownloadResult(&context, request);
    v1::DownloadResultChunk chunk;
    absl::Status failure;
    while (failure.ok() && reader->Read(&chunk)) {
      if (!chunk.sha256().empty()) {
        if (!announced.empty() && announced != chunk.sha256()) {
          failure =
              absl::DataLossError(absl::StrCat("the result of job ", job_id, " changed during the download"));
        }
        announced = chunk.sha256();
      }
      if (failure.ok() && chunk.offset() != offset) {
        failure = absl::DataLossError(
            absl::StrCat("the server sent bytes at offset ", chunk.offset(), " where ", offset, " was due"));
      }
      if (!failure.ok()) break;
      total = chunk.total_size();
      failure = writer.Append(chunk.data());
      hash.Update(chunk.data());
      offset += static_cast<int64_t>(chunk.data().size());
      if (!chunk.data().empty()) budget.Progress();
      if (on_progress) on_progress(offset, total);
    }
    if (!failure.ok()) {
      context.TryCancel();
      reader->Finish();
      return failure;
    }
    absl::Status finished = FromGrpcStatus(reader->Finish());
    if (finished.ok() && total >= 0 && offset >= total) break;
    // A stream that ended early without an error is as broken as one that failed.
    if (finished.ok()) finished = absl::UnavailableError("the download ended early");
    if (!client_internal::IsRetryable(finished) || !budget.Wait()) return impl_->Explain(finished);
    ++result.resumes;
  }
  result.size = offset;
  result.sha256 = hash.HexDigest();
  if (offset != total || result.sha256 != announced) {
    return absl::DataLossError(absl::StrCat("downloaded ", offset, " bytes with sha256 ", result.sha256,
                                            "; the server announced ", total, " bytes with sha256 ",
                                            announced));
  }
  RECAL_RETURN_IF_ERROR(writer.Commit());
  return result;
}

}  // namespace recal
