// Where a model's bytes come from and what kind of archive they are, decided from the bytes:
// recal-run names a file, recal-worker an open descriptor ("fd:N"), so that the sandbox
// need not allow the model's path.
#pragma once

#include <memory>
#include <string>

#include <caffe2/serialize/read_adapter_interface.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace recal::engine {

// A model path "fd:N" names an archive open on file descriptor N (recal-worker).
inline constexpr absl::string_view kModelFdPrefix = "fd:";

using ReadAdapter = caffe2::serialize::ReadAdapterInterface;

// The model file at `path` (or "fd:N"), read in place. NOT_FOUND for a missing file,
// INVALID_ARGUMENT for a bad descriptor or something that is not a regular file.
absl::StatusOr<std::shared_ptr<ReadAdapter>> OpenModelFile(const std::string& path);

// Bytes held in memory, read in place (the reload checks read what they are about to write).
std::shared_ptr<ReadAdapter> BytesReader(absl::string_view bytes);

// The size of `record` as the zip's directory gives it; INVALID_ARGUMENT (unprefixed) when
// the record is missing or its bytes reach past the end of the archive (a compressed record
// expanding beyond it included: torch.jit.save and torch.export.save store tensors and
// pickles uncompressed). Throws what the reader throws.
absl::StatusOr<int64_t> RecordInArchive(caffe2::serialize::PyTorchStreamReader& reader, const std::string& record,
                                        size_t archive_bytes);

enum class ModelFormat {
  kTorchScript,       // torch.jit.save
  kExportedProgram,   // torch.export.save: a PT2 archive
};

// "torchscript" or "exported_program" (the report's model_format).
const char* ModelFormatName(ModelFormat format);

// What the bytes are. INVALID_ARGUMENT, saying which formats are accepted and how to make
// one, for anything else (a state_dict, a pickle, an ONNX file, a truncated upload).
absl::StatusOr<ModelFormat> DetectModelFormat(const std::shared_ptr<ReadAdapter>& file);

}  // namespace recal::engine
