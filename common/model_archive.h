// What kind of model archive a file is, told from its zip directory without LibTorch, so
// that a client refuses what the server would refuse before sending any byte. The rules are
// the server's (server/engine/model_file.cc, DetectModelFormat), with the same words:
//   not a zip ("PK\x03\x04" at the start)      refused: a pickle, an ONNX file, a truncated copy
//   an `archive_format` record                 a torch.export program (PT2)
//   `constants.pkl` or `code/__torch__.py`     TorchScript
//   `data.pkl` only                            refused: torch.save's state_dict or pickled module
//   none of them                               refused: a zip, but not a model archive
// A record is named under the archive's top folder (its first entry's), as PyTorch's reader
// names it. The Python client has the same rules (client/python/recal/archive.py).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recal {

enum class ArchiveKind {
  kExportedProgram,
  kTorchScript,
  kUnread,  // a zip whose directory this reader does not follow (ZIP64 beyond it, ...): the server judges
};

// INVALID_ARGUMENT naming `path` (ending "nothing was sent") for a file the server would
// refuse; errno codes for one that cannot be read.
absl::StatusOr<ArchiveKind> SniffModelArchive(const std::string& path);

// The rules above on the record names of an archive (top folder included, as in the zip).
absl::StatusOr<ArchiveKind> ArchiveKindOfRecords(const std::vector<std::string>& names, const std::string& path);

}  // namespace recal
