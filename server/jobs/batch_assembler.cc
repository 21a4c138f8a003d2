#include "server/jobs/batch_assembler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/jobs/stream_feed.h"

namespace recal::jobs {

absl::StatusOr<v1::PushBatchesRequest*> BatchAssembler::Add(v1::PushBatchesRequest& message) {
  if (!assembling_) {
    if (!message.batch_continues()) return &message;
    RECAL_RETURN_IF_ERROR(Start(message));
    return nullptr;
  }
  ++parts_;
  RECAL_RETURN_IF_ERROR(Append(message));
  if (message.batch_continues()) {
    if (message.last()) {
      return absl::InvalidArgumentError("only the part that completes a batch may be marked last");
    }
    return nullptr;
  }
  for (int i = 0; i < batch_.inputs_size(); ++i) {
    const int64_t got = static_cast<int64_t>(batch_.inputs(i).data().size());
    if (got != expected_bytes_[i]) {
      return absl::InvalidArgumentError(absl::StrCat("input ", i, " of a batch sent in ", parts_,
                                                     " parts has ", got, " bytes of data; its dtype and shape need ",
                                                     expected_bytes_[i]));
    }
  }
  assembling_ = false;
  batch_.set_batch_continues(false);
  batch_.set_last(message.last());
  return &batch_;
}

absl::Status BatchAssembler::Start(v1::PushBatchesRequest& first) {
  if (first.last()) return absl::InvalidArgumentError("only the part that completes a batch may be marked last");
  if (first.inputs().empty()) {
    return absl::InvalidArgumentError("the first part of a batch sent in parts carries its inputs' dtype and shape");
  }
  expected_bytes_.clear();
  int64_t total = 0;
  for (const v1::Tensor& input : first.inputs()) {
    RECAL_ASSIGN_OR_RETURN(const int64_t bytes, PushedTensorBytes(input, max_batch_bytes_));
    if (static_cast<int64_t>(input.data().size()) > bytes) {
      return absl::InvalidArgumentError(absl::StrCat("the first part of a batch carries ", input.data().size(),
                                                     " bytes for an input of ", bytes));
    }
    total += bytes;  // each is at most max_batch_bytes_: no overflow for any sane count
    if (total > max_batch_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat("a batch sent in parts declares more than the server's batch "
                                                       "limit of ", max_batch_bytes_,
                                                       " bytes in all its inputs (--max_batch_bytes)"));
    }
    expected_bytes_.push_back(bytes);
  }
  batch_ = std::move(first);
  assembling_ = true;
  parts_ = 1;
  return absl::OkStatus();
}

absl::Status BatchAssembler::Append(const v1::PushBatchesRequest& part) {
  if (part.inputs_size() != batch_.inputs_size()) {
    return absl::InvalidArgumentError(absl::StrCat("part ", parts_, " of a batch carries ", part.inputs_size(),
                                                   " inputs; the batch has ", batch_.inputs_size()));
  }
  for (int i = 0; i < part.inputs_size(); ++i) {
    const v1::Tensor& piece = part.inputs(i);
    if (piece.dtype() != v1::Tensor::DTYPE_UNSPECIFIED || !piece.shape().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("part ", parts_, " of a batch sets a dtype or shape: only the first part carries them"));
    }
    std::string* data = batch_.mutable_inputs(i)->mutable_data();
    if (static_cast<int64_t>(data->size() + piece.data().size()) > expected_bytes_[i]) {
      return absl::InvalidArgumentError(absl::StrCat("the parts of a batch carry more than the ", expected_bytes_[i],
                                                     " bytes of input ", i, "'s dtype and shape"));
    }
    data->append(piece.data());
  }
  return absl::OkStatus();
}

absl::Status BatchAssembler::Finish() const {
  if (!assembling_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("the stream ended inside a batch sent in parts (after part ", parts_,
                                                 "); the part that completes a batch has batch_continues unset"));
}

}  // namespace recal::jobs
