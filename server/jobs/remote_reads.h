// The server's side of a sandboxed worker's reads of data in a bucket (the worker's side:
// server/worker/remote_objects.h). The worker has no network and no credentials; the
// runner that started it found the job's objects (data::LocateObjects: roots checked, one
// HEAD or one listing) and answers the worker's ReadRequests for byte ranges of those
// objects, and only those: an index into that list, within the object's size, at most
// kMaxReadRequestBytes a request, each GET pinned to the version the runner saw. A few
// threads answer at once (the worker's decoding threads fetch images ahead of the reader);
// a request waits while they are all busy, so a worker cannot make the server hold more
// than a few replies in memory.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "recal/worker/v1/worker.pb.h"
#include "server/data_access/object_storage.h"

namespace recal::jobs {

class RemoteReads {
 public:
  using ReplyWriter = std::function<absl::Status(const worker::v1::ReadReply&)>;

  // `write` sends one reply to the worker (thread-safe).
  RemoteReads(std::shared_ptr<data::ObjectStorage> storage, data::LocatedObjects located, ReplyWriter write,
              int threads = 4);
  // Stop()s.
  ~RemoteReads();
  RemoteReads(const RemoteReads&) = delete;
  RemoteReads& operator=(const RemoteReads&) = delete;

  // Queues a request; blocks while as many wait as there are threads.
  void Serve(const worker::v1::ReadRequest& request);
  // The worker is gone: requests not started are dropped, those being answered finish.
  void Stop();

 private:
  void Answer(const worker::v1::ReadRequest& request);
  void Loop();

  const std::shared_ptr<data::ObjectStorage> storage_;
  const data::LocatedObjects located_;
  const ReplyWriter write_;
  const size_t max_waiting_;

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<worker::v1::ReadRequest> waiting_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace recal::jobs
