#include "server/jobs/remote_reads.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/worker/channel.h"

namespace recal::jobs {

namespace wire = worker::v1;

RemoteReads::RemoteReads(std::shared_ptr<data::ObjectStorage> storage, data::LocatedObjects located,
                         ReplyWriter write, int threads)
    : storage_(std::move(storage)),
      located_(std::move(located)),
      write_(std::move(write)),
      max_waiting_(static_cast<size_t>(std::max(1, threads))) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Loop(); });
}

RemoteReads::~RemoteReads() { Stop(); }

void RemoteReads::Serve(const wire::ReadRequest& request) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return stopping_ || waiting_.size() < max_waiting_; });
  if (stopping_) return;
  waiting_.push_back(request);
  changed_.notify_all();
}

void RemoteReads::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    waiting_.clear();
    changed_.notify_all();
  }
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

void RemoteReads::Loop() {
  while (true) {
    wire::ReadRequest request;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return stopping_ || !waiting_.empty(); });
      if (stopping_) return;
      request = std::move(waiting_.front());
      waiting_.pop_front();
      changed_.notify_all();
    }
    Answer(request);
  }
}

void RemoteReads::Answer(const wire::ReadRequest& request) {
  wire::ReadReply reply;
  reply.set_id(request.id());
  auto fail = [&reply](const absl::Status& status) {
    reply.mutable_failure()->set_code(static_cast<int>(status.code()));
    reply.mutable_failure()->set_message(std::string(status.message()));
  };
  // The worker runs the uploaded model: what it asks is checked against what was found.
  if (request.object() < 0 || request.object() >= static_cast<int>(located_.objects.size())) {
    fail(absl::InvalidArgumentError(absl::StrCat("no object ", request.object(), " in this job's data")));
  } else {
    const s3::ObjectInfo& object = located_.objects[static_cast<size_t>(request.object())];
    if (request.offset() < 0 || request.length() < 0 || request.length() > worker::kMaxReadRequestBytes ||
        request.offset() > object.size || request.length() > object.size - request.offset()) {
      fail(absl::OutOfRangeError(absl::StrCat("s3://", located_.bucket, "/", object.key, ": bytes [",
                                              request.offset(), ", +", request.length(),
                                              ") are not a range of its ", object.size, " bytes that one read may ask for")));
    } else {
      std::string* bytes = reply.mutable_data();
      bytes->resize(static_cast<size_t>(request.length()));
      absl::Status read = storage_->Read(located_.bucket, object, request.offset(), absl::MakeSpan(*bytes));
      if (!read.ok()) {
        reply.clear_data();
        fail(read);
      }
    }
  }
  // A worker that went away cannot read it; the job's end says why.
  write_(reply).IgnoreError();
}

}  // namespace recal::jobs
