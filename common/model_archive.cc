#include "common/model_archive.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace recal {
namespace {

constexpr char kAccepted[] =
    "Recal reads TorchScript (torch.jit.save(torch.jit.script(model), 'model.pt')) and torch.export programs "
    "(torch.export.save(torch.export.export(model, example_inputs), 'model.pt2'))";
constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50;
constexpr size_t kEndRecordBytes = 22;
constexpr size_t kMaxCommentBytes = 0xFFFF;
// A directory larger than this is left to the server (a PT2 program has a few hundred records).
constexpr uint64_t kMaxDirectoryBytes = 64u << 20;

absl::Status Refused(const std::string& path, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", why, ". ", kAccepted, "; nothing was sent"));
}

uint32_t Le(const std::string& bytes, size_t at, int width) {
  uint32_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

bool ReadAt(std::ifstream& in, uint64_t offset, size_t size, std::string* out) {
  out->resize(size);
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  return static_cast<bool>(in.read(out->data(), static_cast<std::streamsize>(size)));
}

// The record names of the zip's central directory, or false where this reader does not
// follow it (ZIP64 sizes, a directory past the end, a damaged entry).
bool DirectoryNames(std::ifstream& in, uint64_t file_size, std::vector<std::string>* names) {
  const uint64_t tail_size = std::min<uint64_t>(file_size, kEndRecordBytes + kMaxCommentBytes);
  std::string tail;
  if (!ReadAt(in, file_size - tail_size, tail_size, &tail) || tail.size() < kEndRecordBytes) return false;
  size_t end = std::string::npos;
  for (size_t at = tail.size() - kEndRecordBytes + 1; at-- > 0;) {
    if (Le(tail, at, 4) == kEndOfDirectory) {
      end = at;
      break;
    }
  }
  if (end == std::string::npos) return false;
  const uint32_t entries = Le(tail, end + 10, 2), size = Le(tail, end + 12, 4), offset = Le(tail, end + 16, 4);
  if (entries == 0xFFFF || size == 0xFFFFFFFF || offset == 0xFFFFFFFF) return false;  // ZIP64
  if (size > kMaxDirectoryBytes || uint64_t{offset} + size > file_size) return false;
  std::string directory;
  if (!ReadAt(in, offset, size, &directory)) return false;
  for (size_t at = 0, i = 0; i < entries; ++i) {
    if (at + 46 > directory.size() || Le(directory, at, 4) != kDirectoryEntry) return false;
    const size_t name = Le(directory, at + 28, 2), extra = Le(directory, at + 30, 2),
                 comment = Le(directory, at + 32, 2);
    if (at + 46 + name > directory.size()) return false;
    names->push_back(directory.substr(at + 46, name));
    at += 46 + name + extra + comment;
  }
  return true;
}

}  // namespace

absl::StatusOr<ArchiveKind> ArchiveKindOfRecords(const std::vector<std::string>& names, const std::string& path) {
  std::set<std::string> records;
  if (!names.empty()) {
    const std::string top = names.front().substr(0, names.front().find('/') + 1);
    for (const std::string& name : names) {
      if (!top.empty() && absl::StartsWith(name, top)) records.insert(name.substr(top.size()));
    }
  }
  if (records.count("archive_format")) return ArchiveKind::kExportedProgram;
  if (records.count("constants.pkl") || records.count("code/__torch__.py")) return ArchiveKind::kTorchScript;
  if (records.count("data.pkl")) {
    return Refused(path,
                   "a torch.save file (a state_dict or a pickled module), not a model program: load it into its "
                   "module and export that (or give the module to recal.torch.recalibrate, which exports it)");
  }
  return Refused(path, "a zip file but not a model archive");
}

absl::StatusOr<ArchiveKind> SniffModelArchive(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open model '", path, "'"));
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  std::string magic;
  if (file_size < 4 || !ReadAt(in, 0, 4, &magic) || magic != std::string("PK\x03\x04", 4)) {
    return Refused(path, "not a model archive (not a zip file: a truncated copy, a pickle, an ONNX file?)");
  }
  std::vector<std::string> names;
  if (!DirectoryNames(in, file_size, &names)) return ArchiveKind::kUnread;
  return ArchiveKindOfRecords(names, path);
}

}  // namespace recal
