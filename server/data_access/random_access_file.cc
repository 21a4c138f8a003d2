#include "server/data_access/random_access_file.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/mapped_file.h"

namespace recal::data {
namespace {

class LocalFile final : public RandomAccessFile {
 public:
  explicit LocalFile(std::unique_ptr<MappedFile> file) : file_(std::move(file)) {}
  const std::string& name() const override { return file_->path(); }
  int64_t size() const override { return static_cast<int64_t>(file_->size()); }
  const char* mapped() const override { return file_->bytes().data(); }
  absl::Status ReadAt(int64_t offset, absl::Span<char> out) const override {
    if (offset < 0 || offset > size() || static_cast<int64_t>(out.size()) > size() - offset) {
      return absl::OutOfRangeError(absl::StrCat(name(), ": bytes [", offset, ", ", offset + out.size(),
                                                ") lie beyond its ", size(), " bytes"));
    }
    std::memcpy(out.data(), file_->bytes().data() + offset, out.size());
    return absl::OkStatus();
  }

 private:
  const std::unique_ptr<MappedFile> file_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const RandomAccessFile>> OpenLocalFile(const std::string& path) {
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  return std::shared_ptr<const RandomAccessFile>(std::make_shared<LocalFile>(*std::move(file)));
}

}  // namespace recal::data
