#include "server/worker/remote_objects.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace recal::worker {
namespace {

class Remote final : public data::ObjectStorage {
 public:
  Remote(const v1::RemoteObjects& objects, MessageReader* replies, EventSink send)
      : bucket_(objects.bucket()), replies_(replies), send_(std::move(send)) {
    for (int i = 0; i < objects.objects_size(); ++i) {
      index_.emplace(objects.objects(i).key(), i);
      objects_.push_back({objects.objects(i).key(), objects.objects(i).size(), ""});
    }
  }

  absl::StatusOr<s3::ObjectInfo> Stat(const std::string& bucket, const std::string& key) override {
    if (bucket == bucket_) {
      auto found = index_.find(key);
      if (found != index_.end()) return objects_[found->second];
    }
    return absl::NotFoundError(absl::StrCat("s3://", bucket, "/", key, " is not an object the server found for this job"));
  }

  absl::StatusOr<std::vector<s3::ObjectInfo>> List(const std::string& bucket, const std::string& prefix) override {
    std::vector<s3::ObjectInfo> listed;
    if (bucket != bucket_) return listed;
    for (const s3::ObjectInfo& object : objects_) {
      if (object.key.compare(0, prefix.size(), prefix) == 0) listed.push_back(object);
    }
    return listed;
  }

  absl::Status Read(const std::string& bucket, const s3::ObjectInfo& object, int64_t offset,
                    absl::Span<char> out) override {
    absl::StatusOr<s3::ObjectInfo> known = Stat(bucket, object.key);
    if (!known.ok()) return known.status();
    const int index = index_.at(object.key);
    for (size_t done = 0; done < out.size();) {
      const size_t length = std::min(out.size() - done, static_cast<size_t>(kMaxReadRequestBytes));
      if (absl::Status got = ReadPiece(index, offset + static_cast<int64_t>(done), out.subspan(done, length));
          !got.ok()) {
        return got;
      }
      done += length;
    }
    return absl::OkStatus();
  }

 private:
  struct Pending {
    std::optional<v1::ReadReply> reply;
  };

  absl::Status ReadPiece(int object, int64_t offset, absl::Span<char> out) {
    int64_t id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.ok()) return broken_;
      id = next_id_++;
      pending_[id];
    }
    v1::Event event;
    v1::ReadRequest* request = event.mutable_read_request();
    request->set_id(id);
    request->set_object(object);
    request->set_offset(offset);
    request->set_length(static_cast<int64_t>(out.size()));
    absl::Status sent = send_(event);
    std::unique_lock<std::mutex> lock(mu_);
    if (!sent.ok()) {
      pending_.erase(id);
      return sent;
    }
    // Whoever waits reads the next reply for everyone: one reader at a time on stdin.
    while (!pending_[id].reply && broken_.ok()) {
      if (reading_) {
        changed_.wait(lock);
        continue;
      }
      reading_ = true;
      lock.unlock();
      v1::ReadReply reply;
      absl::StatusOr<bool> read = replies_->Read(&reply);
      lock.lock();
      reading_ = false;
      if (!read.ok() || !*read) {
        broken_ = absl::UnavailableError(absl::StrCat("the server stopped answering reads of the job's data",
                                                      read.ok() ? "" : ": ", read.ok() ? "" : read.status().message()));
      } else if (auto waiting = pending_.find(reply.id()); waiting != pending_.end() && !waiting->second.reply) {
        waiting->second.reply = std::move(reply);
      } else {
        broken_ = absl::InternalError(absl::StrCat("the server answered a read never asked for (id ", reply.id(), ")"));
      }
      changed_.notify_all();
    }
    std::optional<v1::ReadReply> reply = std::move(pending_[id].reply);
    pending_.erase(id);
    if (!reply) return broken_;
    lock.unlock();
    if (reply->has_failure()) {
      return absl::Status(static_cast<absl::StatusCode>(reply->failure().code()), reply->failure().message());
    }
    if (reply->data().size() != out.size()) {
      return absl::DataLossError(absl::StrCat("the server answered a read of ", out.size(), " bytes with ",
                                              reply->data().size()));
    }
    std::memcpy(out.data(), reply->data().data(), out.size());
    return absl::OkStatus();
  }

  const std::string bucket_;
  std::map<std::string, int> index_;
  std::vector<s3::ObjectInfo> objects_;
  MessageReader* const replies_;
  const EventSink send_;

  std::mutex mu_;
  std::condition_variable changed_;
  int64_t next_id_ = 1;
  std::map<int64_t, Pending> pending_;
  bool reading_ = false;
  absl::Status broken_;  // not OK once stdin failed: every read fails with it
};

}  // namespace

std::shared_ptr<data::ObjectStorage> RemoteObjects(const v1::RemoteObjects& objects, MessageReader* replies,
                                                   EventSink send) {
  return std::make_shared<Remote>(objects, replies, std::move(send));
}

}  // namespace recal::worker
