// Data in a bucket read by a sandboxed worker through the server: the worker's side
// (server/worker/remote_objects.h) and the server's (server/jobs/remote_reads.h) over real
// pipes, with an in-memory bucket behind the server. Reads from many threads get exactly
// their bytes, long reads are split, the bucket's errors reach the reader with their codes,
// a worker that asks for what its job was not given gets a refusal and never a byte, and a
// server that goes away fails the reads instead of hanging them.
#include "server/jobs/remote_reads.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "server/data/batch_source.h"
#include "server/worker/channel.h"
#include "server/worker/remote_objects.h"
#include "tests/test_util.h"

namespace recal::jobs {
namespace {

namespace wire = worker::v1;
using ::testing::HasSubstr;

class MemoryBucket final : public data::ObjectStorage {
 public:
  void Put(const std::string& key, std::string bytes) { objects_[key] = std::move(bytes); }
  void FailReadsOf(const std::string& key, absl::Status status) { failing_[key] = std::move(status); }
  int reads() const { return reads_.load(); }

  absl::StatusOr<s3::ObjectInfo> Stat(const std::string& bucket, const std::string& key) override {
    auto found = objects_.find(key);
    if (bucket != "bkt" || found == objects_.end()) return absl::NotFoundError(absl::StrCat("no s3://", bucket, "/", key));
    return s3::ObjectInfo{key, static_cast<int64_t>(found->second.size()), absl::StrCat("etag-", key)};
  }
  absl::StatusOr<std::vector<s3::ObjectInfo>> List(const std::string& bucket, const std::string& prefix) override {
    std::vector<s3::ObjectInfo> listed;
    for (const auto& [key, bytes] : objects_) {
      if (key.rfind(prefix, 0) == 0) listed.push_back(*Stat(bucket, key));
    }
    return listed;
  }
  absl::Status Read(const std::string& bucket, const s3::ObjectInfo& object, int64_t offset,
                    absl::Span<char> out) override {
    ++reads_;
    if (auto failing = failing_.find(object.key); failing != failing_.end()) return failing->second;
    EXPECT_EQ(object.etag, absl::StrCat("etag-", object.key)) << "every read is pinned to the version found";
    const std::string& bytes = objects_.at(object.key);
    EXPECT_LE(offset + static_cast<int64_t>(out.size()), static_cast<int64_t>(bytes.size()));
    std::copy_n(bytes.data() + offset, out.size(), out.data());
    return absl::OkStatus();
  }

 private:
  std::map<std::string, std::string> objects_;
  std::map<std::string, absl::Status> failing_;
  std::atomic<int> reads_{0};
};

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  return bytes;
}

// A worker's storage wired to a server's RemoteReads over two pipes, as WorkerRunner::Run
// wires them (events up, replies down).
class Wired {
 public:
  Wired(std::shared_ptr<MemoryBucket> bucket, data::LocatedObjects located) {
    int up[2], down[2];
    EXPECT_EQ(::pipe2(up, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(down, O_CLOEXEC), 0);
    events_read_ = up[0];
    events_write_ = up[1];
    replies_read_ = down[0];
    replies_write_ = down[1];
    replies_ = std::make_unique<worker::MessageReader>(replies_read_, int64_t{64} << 20);
    for (const s3::ObjectInfo& object : located.objects) {
      wire::RemoteObject* out = objects_.add_objects();
      out->set_key(object.key);
      out->set_size(object.size);
    }
    objects_.set_bucket(located.bucket);
    reads_ = std::make_unique<RemoteReads>(bucket, located, [this](const wire::ReadReply& reply) {
      std::lock_guard<std::mutex> lock(reply_mu_);
      if (replies_write_ < 0) return absl::FailedPreconditionError("closed");
      return worker::WriteMessage(replies_write_, reply);
    });
    server_ = std::thread([this] {
      worker::MessageReader events(events_read_, int64_t{64} << 20);
      wire::Event event;
      while (true) {
        absl::StatusOr<bool> read = events.Read(&event);
        if (!read.ok() || !*read) break;
        if (event.has_read_request()) reads_->Serve(event.read_request());
      }
    });
    storage_ = worker::RemoteObjects(objects_, replies_.get(), [this](const wire::Event& event) {
      std::lock_guard<std::mutex> lock(event_mu_);
      return worker::WriteMessage(events_write_, event);
    });
  }
  ~Wired() {
    ::close(events_write_);  // the worker is done: the server's loop ends
    server_.join();
    reads_->Stop();
    CloseReplies();
    ::close(events_read_);
    ::close(replies_read_);
  }
  void CloseReplies() {
    std::lock_guard<std::mutex> lock(reply_mu_);
    if (replies_write_ >= 0) ::close(replies_write_);
    replies_write_ = -1;
  }
  // What a worker that ignores the protocol's rules sends.
  void SendRaw(const wire::Event& event) {
    std::lock_guard<std::mutex> lock(event_mu_);
    ASSERT_TRUE(worker::WriteMessage(events_write_, event).ok());
  }
  wire::ReadReply NextReply() {
    wire::ReadReply reply;
    EXPECT_TRUE(*replies_->Read(&reply));
    return reply;
  }
  data::ObjectStorage& storage() { return *storage_; }
  std::shared_ptr<data::ObjectStorage> shared_storage() { return storage_; }

 private:
  int events_read_, events_write_, replies_read_, replies_write_;
  wire::RemoteObjects objects_;
  std::unique_ptr<worker::MessageReader> replies_;
  std::unique_ptr<RemoteReads> reads_;
  std::thread server_;
  std::mutex reply_mu_, event_mu_;
  std::shared_ptr<data::ObjectStorage> storage_;
};

data::LocatedObjects Locate(MemoryBucket& bucket, const std::string& prefix) {
  return {"bkt", *bucket.List("bkt", prefix)};
}

TEST(RemoteReads, ManyThreadsReadExactlyTheirBytesAndLongReadsAreSplit) {
  auto bucket = std::make_shared<MemoryBucket>();
  const std::string big = RandomBytes(worker::kMaxReadRequestBytes * 2 + 12345, 1);
  bucket->Put("d/big.bin", big);
  for (int i = 0; i < 8; ++i) bucket->Put(absl::StrCat("d/small", i), RandomBytes(1000 + i, 10 + i));
  Wired wired(bucket, Locate(*bucket, "d/"));

  auto whole = wired.storage().Stat("bkt", "d/big.bin");
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::string out(big.size(), '\0');
  ASSERT_TRUE(wired.storage().Read("bkt", *whole, 0, absl::MakeSpan(out)).ok());
  EXPECT_TRUE(out == big);
  EXPECT_EQ(bucket->reads(), 3) << "split into reads of at most kMaxReadRequestBytes";

  std::map<std::string, std::string> expected = {{"d/big.bin", big}};
  for (int i = 0; i < 8; ++i) expected[absl::StrCat("d/small", i)] = RandomBytes(1000 + i, 10 + i);
  std::vector<std::thread> readers;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 8; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 50; ++i) {
        const std::string key = i % 5 == 0 ? "d/big.bin" : absl::StrCat("d/small", (t + i) % 8);
        auto object = wired.storage().Stat("bkt", key);
        const int64_t size = object->size;
        const int64_t offset = static_cast<int64_t>(rng() % static_cast<uint32_t>(size));
        const int64_t length = std::min<int64_t>(size - offset, 1 + rng() % 70000);
        std::string piece(static_cast<size_t>(length), '\0');
        absl::Status read = wired.storage().Read("bkt", *object, offset, absl::MakeSpan(piece));
        if (!read.ok() || piece != expected.at(key).substr(static_cast<size_t>(offset), static_cast<size_t>(length))) {
          ++wrong;
        }
      }
    });
  }
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  // The small objects, whole, from the listing the worker was given.
  auto listed = wired.storage().List("bkt", "d/small");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 8u);
  for (int i = 0; i < 8; ++i) {
    const s3::ObjectInfo& object = (*listed)[static_cast<size_t>(i)];
    std::string bytes(static_cast<size_t>(object.size), '\0');
    ASSERT_TRUE(wired.storage().Read("bkt", object, 0, absl::MakeSpan(bytes)).ok());
    EXPECT_EQ(bytes, expected.at(object.key));
  }
}

TEST(RemoteReads, TheBucketsErrorsReachTheReaderWithTheirCodes) {
  auto bucket = std::make_shared<MemoryBucket>();
  bucket->Put("d/x", "0123456789");
  bucket->Put("d/y", "abcdefghij");
  bucket->FailReadsOf("d/y", absl::UnavailableError("127.0.0.1:9: connection refused after 3 attempts"));
  Wired wired(bucket, Locate(*bucket, "d/"));
  char out[4];
  absl::Status read = wired.storage().Read("bkt", *wired.storage().Stat("bkt", "d/y"), 2, absl::MakeSpan(out));
  EXPECT_EQ(read.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(read.message(), HasSubstr("connection refused"));
  // The worker knows only what it was given.
  EXPECT_EQ(wired.storage().Stat("bkt", "d/z").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(wired.storage().Stat("other", "d/x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(wired.storage().List("other", "").value().empty());
  ASSERT_TRUE(wired.storage().Read("bkt", *wired.storage().Stat("bkt", "d/x"), 6, absl::MakeSpan(out)).ok());
  EXPECT_EQ(std::string(out, 4), "6789");
}

TEST(RemoteReads, AWorkerAskingForWhatItWasNotGivenIsRefusedWithoutARead) {
  auto bucket = std::make_shared<MemoryBucket>();
  bucket->Put("d/x", "0123456789");
  bucket->Put("secret/y", "not yours");
  // The job's objects: d/ only.
  data::LocatedObjects located = Locate(*bucket, "d/");
  ASSERT_EQ(located.objects.size(), 1u);
  // No worker-side storage in the way: raw requests, as a worker whose model got hold of its
  // events pipe would write them.
  Wired wired(bucket, located);
  struct Case {
    int object;
    int64_t offset, length;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {
      {1, 0, 1, absl::StatusCode::kInvalidArgument},     // an object it was not given
      {-1, 0, 1, absl::StatusCode::kInvalidArgument},
      {0, 5, 6, absl::StatusCode::kOutOfRange},          // past the end
      {0, 11, 0, absl::StatusCode::kOutOfRange},
      {0, -1, 2, absl::StatusCode::kOutOfRange},
      {0, 0, -2, absl::StatusCode::kOutOfRange},
      {0, 0, worker::kMaxReadRequestBytes + 1, absl::StatusCode::kOutOfRange},  // more than one read may ask
      {0, int64_t{1} << 62, int64_t{1} << 62, absl::StatusCode::kOutOfRange},   // overflowing the sum
  };
  int id = 100;
  for (const Case& c : cases) {
    wire::Event event;
    event.mutable_read_request()->set_id(++id);
    event.mutable_read_request()->set_object(c.object);
    event.mutable_read_request()->set_offset(c.offset);
    event.mutable_read_request()->set_length(c.length);
    wired.SendRaw(event);
    const wire::ReadReply reply = wired.NextReply();
    EXPECT_EQ(reply.id(), id);
    EXPECT_TRUE(reply.data().empty());
    EXPECT_EQ(static_cast<absl::StatusCode>(reply.failure().code()), c.code)
        << c.object << " " << c.offset << " " << c.length << ": " << reply.failure().message();
  }
  EXPECT_EQ(bucket->reads(), 0) << "nothing refused reached the bucket";
}

TEST(RemoteReads, AServerThatGoesAwayFailsTheReadsInsteadOfHangingThem) {
  auto bucket = std::make_shared<MemoryBucket>();
  bucket->Put("d/x", "0123456789");
  Wired wired(bucket, Locate(*bucket, "d/"));
  wired.CloseReplies();
  char out[4];
  absl::Status read = wired.storage().Read("bkt", *wired.storage().Stat("bkt", "d/x"), 0, absl::MakeSpan(out));
  EXPECT_EQ(read.code(), absl::StatusCode::kUnavailable) << read;
  // And every later read, at once.
  EXPECT_EQ(wired.storage().Read("bkt", *wired.storage().Stat("bkt", "d/x"), 0, absl::MakeSpan(out)).code(),
            absl::StatusCode::kUnavailable);
}

TEST(RemoteReads, ANpyFileThroughTheServerGivesTheBatchesOfTheLocalFile) {
  testing::TempDir tmp;
  std::vector<float> values(7 * 3 * 4 * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.25f - 3.0f;
  const std::string npy =
      testing::NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (7, 3, 4, 4), }", testing::BytesOf(values));
  testing::WriteBytes(tmp.File("x.npy"), npy);
  auto bucket = std::make_shared<MemoryBucket>();
  bucket->Put("d/x.npy", npy);
  Wired wired(bucket, {"bkt", {*bucket->Stat("bkt", "d/x.npy")}});
  data::InputOptions remote;
  remote.access.object_storage = wired.shared_storage();
  remote.access.data_roots = {"s3://bkt/d"};
  auto from_bucket = data::OpenBatchSource("npy:s3://bkt/d/x.npy", 3, remote);
  ASSERT_TRUE(from_bucket.ok()) << from_bucket.status();
  auto from_disk = data::OpenBatchSource("npy:" + tmp.File("x.npy"), 3);
  ASSERT_TRUE(from_disk.ok()) << from_disk.status();
  int batches = 0;
  while (true) {
    auto a = (*from_bucket)->Next();
    auto b = (*from_disk)->Next();
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->has_value(), b->has_value());
    if (!a->has_value()) break;
    ++batches;
    ASSERT_EQ((**a).size(), 1u);
    EXPECT_TRUE((**a)[0].equal((**b)[0]));
  }
  EXPECT_EQ(batches, 3);
  // Outside the roots the worker was given: refused before anything is asked.
  data::InputOptions elsewhere = remote;
  elsewhere.access.data_roots = {"s3://bkt/other"};
  EXPECT_EQ(data::OpenBatchSource("npy:s3://bkt/d/x.npy", 3, elsewhere).status().code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace recal::jobs
