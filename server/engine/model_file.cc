#include "server/engine/model_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <caffe2/serialize/inline_container.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace recal::engine {
namespace {

class FdReader : public ReadAdapter {
 public:
  // Owns `fd` when `owned` (a path opened here), else the caller keeps it open.
  FdReader(int fd, size_t size, bool owned) : fd_(fd), size_(size), owned_(owned) {}
  ~FdReader() override {
    if (owned_) ::close(fd_);
  }
  size_t size() const override { return size_; }
  size_t read(uint64_t pos, void* buf, size_t n, const char* what) const override {
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, static_cast<char*>(buf) + done, n - done, pos + done);
      if (got < 0 && errno == EINTR) continue;
      TORCH_CHECK(got > 0, "cannot read the model archive (", what, ")");
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  const int fd_;
  const size_t size_;
  const bool owned_;
};

class BytesReaderImpl : public ReadAdapter {
 public:
  explicit BytesReaderImpl(absl::string_view bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const absl::string_view bytes_;
};

constexpr char kAcceptedFormats[] =
    "Recal reads TorchScript (torch.jit.save(torch.jit.script(model), 'model.pt')) and "
    "torch.export programs (torch.export.save(torch.export.export(model, example_inputs), "
    "'model.pt2'))";

}  // namespace

absl::StatusOr<std::shared_ptr<ReadAdapter>> OpenModelFile(const std::string& path) {
  int fd = -1;
  bool owned = false;
  if (absl::StartsWith(path, kModelFdPrefix)) {
    if (!absl::SimpleAtoi(path.substr(kModelFdPrefix.size()), &fd) || fd < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad model descriptor ", path));
    }
  } else {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return errno == ENOENT ? absl::NotFoundError(absl::StrCat("no model file ", path))
                             : absl::InvalidArgumentError(absl::StrCat("cannot open model file ", path, ": ",
                                                                       std::strerror(errno)));
    }
    owned = true;
  }
  struct stat info;
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    if (owned) ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  return std::shared_ptr<ReadAdapter>(std::make_shared<FdReader>(fd, static_cast<size_t>(info.st_size), owned));
}

std::shared_ptr<ReadAdapter> BytesReader(absl::string_view bytes) {
  return std::make_shared<BytesReaderImpl>(bytes);
}

absl::StatusOr<int64_t> RecordInArchive(caffe2::serialize::PyTorchStreamReader& reader, const std::string& record,
                                        size_t archive_bytes) {
  if (!reader.hasRecord(record)) return absl::InvalidArgumentError(absl::StrCat("has no record ", record));
  const size_t size = reader.getRecordSize(record);
  const size_t offset = reader.getRecordOffset(record);
  if (offset > archive_bytes || size > archive_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat("record ", record, " claims ", size, " bytes at offset ", offset,
                                                   ", past the end of the ", archive_bytes, "-byte archive"));
  }
  return static_cast<int64_t>(size);
}

const char* ModelFormatName(ModelFormat format) {
  return format == ModelFormat::kExportedProgram ? "exported_program" : "torchscript";
}

absl::StatusOr<ModelFormat> DetectModelFormat(const std::shared_ptr<ReadAdapter>& file) {
  char magic[4] = {};
  if (file->size() < sizeof(magic) || file->read(0, magic, sizeof(magic), "magic") != sizeof(magic) ||
      std::memcmp(magic, "PK\x03\x04", sizeof(magic)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a model archive (not a zip file: a truncated upload, a pickle, an ONNX file?). ",
                     kAcceptedFormats));
  }
  try {
    caffe2::serialize::PyTorchStreamReader reader(file);
    if (reader.hasRecord("archive_format")) return ModelFormat::kExportedProgram;
    if (reader.hasRecord("constants.pkl") || reader.hasRecord("code/__torch__.py")) {
      return ModelFormat::kTorchScript;
    }
    if (reader.hasRecord("data.pkl")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a torch.save file (a state_dict or a pickled module), not a model program. ", kAcceptedFormats));
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a readable model archive (a damaged or truncated zip). ", kAcceptedFormats));
  }
  return absl::InvalidArgumentError(absl::StrCat("a zip file but not a model archive. ", kAcceptedFormats));
}

}  // namespace recal::engine
