#include "server/data_access/object_storage.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace recal::data {
namespace {

class Bucket final : public ObjectStorage {
 public:
  explicit Bucket(std::unique_ptr<s3::S3Client> client) : client_(std::move(client)) {}

  absl::StatusOr<s3::ObjectInfo> Stat(const std::string& bucket, const std::string& key) override {
    absl::StatusOr<s3::ObjectMeta> meta = client_->HeadObject(bucket, key);
    if (!meta.ok()) return meta.status();
    return s3::ObjectInfo{key, meta->size, meta->etag};
  }

  absl::StatusOr<std::vector<s3::ObjectInfo>> List(const std::string& bucket, const std::string& prefix) override {
    return client_->ListObjects(bucket, prefix);
  }

  absl::Status Read(const std::string& bucket, const s3::ObjectInfo& object, int64_t offset,
                    absl::Span<char> out) override {
    // One GET for the whole span; ReadRange returns less only where the object ends, which
    // the If-Match on the listed ETag rules out, but a short answer is not trusted.
    size_t done = 0;
    while (done < out.size()) {
      absl::StatusOr<size_t> got = client_->ReadRange(bucket, object.key, offset + static_cast<int64_t>(done),
                                                      out.subspan(done), object.etag);
      if (!got.ok()) return got.status();
      if (*got == 0) {
        return absl::DataLossError(absl::StrCat("s3://", bucket, "/", object.key, ": the object ended at ",
                                                offset + static_cast<int64_t>(done), " bytes, before the ",
                                                object.size, " it was listed with"));
      }
      done += *got;
    }
    return absl::OkStatus();
  }

 private:
  const std::unique_ptr<s3::S3Client> client_;
};

class Object final : public RandomAccessFile {
 public:
  Object(std::shared_ptr<ObjectStorage> storage, std::string bucket, s3::ObjectInfo object)
      : storage_(std::move(storage)),
        bucket_(std::move(bucket)),
        object_(std::move(object)),
        name_(absl::StrCat("s3://", bucket_, "/", object_.key)) {}

  const std::string& name() const override { return name_; }
  int64_t size() const override { return object_.size; }

  absl::Status ReadAt(int64_t offset, absl::Span<char> out) const override {
    if (offset < 0 || offset > object_.size || static_cast<int64_t>(out.size()) > object_.size - offset) {
      return absl::OutOfRangeError(absl::StrCat(name_, ": bytes [", offset, ", ", offset + out.size(),
                                                ") lie beyond its ", object_.size, " bytes"));
    }
    return storage_->Read(bucket_, object_, offset, out);
  }

 private:
  const std::shared_ptr<ObjectStorage> storage_;
  const std::string bucket_;
  const s3::ObjectInfo object_;
  const std::string name_;
};

}  // namespace

absl::StatusOr<s3::S3ClientOptions> ObjectStorageOptions(const s3::S3Settings& settings, const s3::EnvLookup& env) {
  absl::StatusOr<s3::S3Config> config = s3::MakeS3Config(settings, env);
  if (!config.ok()) return config.status();
  s3::S3ClientOptions options;
  options.config = *std::move(config);
  return options;
}

absl::StatusOr<std::shared_ptr<ObjectStorage>> ConnectBucket(const s3::S3ClientOptions& options) {
  absl::StatusOr<std::unique_ptr<s3::S3Client>> client = s3::S3Client::Create(options);
  if (!client.ok()) return client.status();
  return std::shared_ptr<ObjectStorage>(std::make_shared<Bucket>(*std::move(client)));
}

std::shared_ptr<const RandomAccessFile> ObjectFile(std::shared_ptr<ObjectStorage> storage, std::string bucket,
                                                   s3::ObjectInfo object) {
  return std::make_shared<Object>(std::move(storage), std::move(bucket), std::move(object));
}

}  // namespace recal::data
