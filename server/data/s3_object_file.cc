#include "server/data/s3_object_file.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace recal::data {
namespace {

class S3ObjectFile final : public RandomAccessFile {
 public:
  S3ObjectFile(std::shared_ptr<s3::S3Client> client, std::string bucket, std::string key, s3::ObjectMeta meta)
      : client_(std::move(client)),
        bucket_(std::move(bucket)),
        key_(std::move(key)),
        name_(absl::StrCat("s3://", bucket_, "/", key_)),
        meta_(std::move(meta)) {}

  const std::string& name() const override { return name_; }
  int64_t size() const override { return meta_.size; }

  absl::Status ReadAt(int64_t offset, absl::Span<char> out) const override {
    if (offset < 0 || offset > meta_.size || static_cast<int64_t>(out.size()) > meta_.size - offset) {
      return absl::OutOfRangeError(absl::StrCat(name_, ": bytes [", offset, ", ", offset + out.size(),
                                                ") lie beyond its ", meta_.size, " bytes"));
    }
    // One GET for the whole span; ReadRange returns less only where the object ends,
    // which the If-Match on the HEAD's ETag rules out, but a short answer is not trusted.
    size_t done = 0;
    while (done < out.size()) {
      absl::StatusOr<size_t> got =
          client_->ReadRange(bucket_, key_, offset + static_cast<int64_t>(done), out.subspan(done), meta_.etag);
      if (!got.ok()) return got.status();
      if (*got == 0) {
        return absl::DataLossError(absl::StrCat(name_, ": the object ended at ", offset + done,
                                                " bytes, before the ", meta_.size, " its HEAD reported"));
      }
      done += *got;
    }
    return absl::OkStatus();
  }

 private:
  const std::shared_ptr<s3::S3Client> client_;
  const std::string bucket_;
  const std::string key_;
  const std::string name_;
  const s3::ObjectMeta meta_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const RandomAccessFile>> OpenS3Object(std::shared_ptr<s3::S3Client> client,
                                                                     const std::string& bucket,
                                                                     const std::string& key) {
  absl::StatusOr<s3::ObjectMeta> meta = client->HeadObject(bucket, key);
  if (!meta.ok()) return meta.status();
  return std::shared_ptr<const RandomAccessFile>(
      std::make_shared<S3ObjectFile>(std::move(client), bucket, key, *std::move(meta)));
}

}  // namespace recal::data
