// A sandboxed worker's event (recal.worker.v1.Event, serialized: the input) as the runner
// reads it from the worker's events pipe; its ReadRequest is answered by RemoteReads
// (server/jobs/remote_reads.cc), the one place where the process running an uploaded model
// asks the server for bytes of a bucket. Behind it, a bucket in memory holding the job's three
// objects (10 bytes, empty, 64 KiB) and a fourth the job was not given.
//
// Contract: every request gets exactly one reply with its id; a reply with data carries
// exactly the bytes asked for, those of the object at that offset, and nothing outside
// what the job was given is ever read; anything else is a refusal with a code and a message,
// and the bucket is not asked for it.
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "fuzz/fuzz_util.h"
#include "recal/worker/v1/worker.pb.h"
#include "server/jobs/remote_reads.h"
#include "server/worker/channel.h"

namespace {

namespace wire = recal::worker::v1;

class MemoryBucket final : public recal::data::ObjectStorage {
 public:
  std::map<std::string, std::string> objects;
  int reads = 0;

  absl::StatusOr<recal::s3::ObjectInfo> Stat(const std::string&, const std::string& key) override {
    return recal::s3::ObjectInfo{key, static_cast<int64_t>(objects.at(key).size()), "e"};
  }
  absl::StatusOr<std::vector<recal::s3::ObjectInfo>> List(const std::string&, const std::string&) override {
    return std::vector<recal::s3::ObjectInfo>();
  }
  absl::Status Read(const std::string& bucket, const recal::s3::ObjectInfo& object, int64_t offset,
                    absl::Span<char> out) override {
    ++reads;
    FUZZ_CHECK(bucket == "bkt" && object.key != "other/secret", "read of ", bucket, "/", object.key);
    const std::string& bytes = objects.at(object.key);
    FUZZ_CHECK(offset >= 0 && offset + static_cast<int64_t>(out.size()) <= static_cast<int64_t>(bytes.size()),
               "a read of [", offset, ", +", out.size(), ") of an object of ", bytes.size(), " bytes");
    std::copy_n(bytes.data() + offset, out.size(), out.data());
    return absl::OkStatus();
  }
};

struct Server {
  std::shared_ptr<MemoryBucket> bucket = std::make_shared<MemoryBucket>();
  std::unique_ptr<recal::jobs::RemoteReads> reads;
  std::mutex mu;
  std::condition_variable replied;
  std::vector<wire::ReadReply> replies;
};

Server& TheServer() {
  static Server* server = [] {
    auto* s = new Server;
    std::string big(64 << 10, '\0');
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
    s->bucket->objects = {{"d/a", "0123456789"}, {"d/empty", ""}, {"d/big", big}, {"other/secret", "never"}};
    recal::data::LocatedObjects located{"bkt", {}};
    for (const char* key : {"d/a", "d/empty", "d/big"}) located.objects.push_back(*s->bucket->Stat("bkt", key));
    s->reads = std::make_unique<recal::jobs::RemoteReads>(
        s->bucket, located,
        [s](const wire::ReadReply& reply) {
          std::lock_guard<std::mutex> lock(s->mu);
          s->replies.push_back(reply);
          s->replied.notify_all();
          return absl::OkStatus();
        },
        1);
    return s;
  }();
  return *server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  wire::Event event;
  if (!event.ParseFromArray(data, static_cast<int>(size)) || !event.has_read_request()) return 0;
  const wire::ReadRequest& request = event.read_request();
  Server& server = TheServer();
  const int reads_before = server.bucket->reads;
  server.reads->Serve(request);
  wire::ReadReply reply;
  {
    std::unique_lock<std::mutex> lock(server.mu);
    server.replied.wait(lock, [&] { return !server.replies.empty(); });
    FUZZ_CHECK(server.replies.size() == 1, server.replies.size(), " replies to one request");
    reply = server.replies.front();
    server.replies.clear();
  }
  FUZZ_CHECK(reply.id() == request.id(), "reply ", reply.id(), " to request ", request.id());
  const char* keys[] = {"d/a", "d/empty", "d/big"};
  const bool valid = request.object() >= 0 && request.object() < 3 && request.offset() >= 0 &&
                     request.length() >= 0 && request.length() <= recal::worker::kMaxReadRequestBytes &&
                     request.offset() <= static_cast<int64_t>(server.bucket->objects.at(keys[request.object()]).size()) &&
                     request.length() <=
                         static_cast<int64_t>(server.bucket->objects.at(keys[request.object()]).size()) - request.offset();
  if (!valid) {
    FUZZ_CHECK(reply.has_failure() && reply.failure().code() != 0 && !reply.failure().message().empty(),
               "an invalid request was not refused with a code and a message");
    FUZZ_CHECK(reply.data().empty(), "a refusal carried ", reply.data().size(), " bytes");
    FUZZ_CHECK(server.bucket->reads == reads_before, "a refused request reached the bucket");
    return 0;
  }
  FUZZ_CHECK(!reply.has_failure(), "a valid request was refused: ", reply.failure().message());
  const std::string& bytes = server.bucket->objects.at(keys[request.object()]);
  FUZZ_CHECK(reply.data() == bytes.substr(static_cast<size_t>(request.offset()), static_cast<size_t>(request.length())),
             "the reply's bytes are not the object's");
  return 0;
}
