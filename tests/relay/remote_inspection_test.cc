// An api replica's RemoteInspector against a worker's InspectionService, over real gRPC on
// loopback, the worker's endpoint found in a real (SQLite) store as its heartbeat put it. The
// inspector behind the service is a fake that reads what it was given: these tests prove the
// transport, the choice of worker and the refusals; the sandboxed inspection itself is
// WorkerRunner's (tests/jobs/worker_runner_test.cc), and the whole path through real processes
// is tests/server/cluster_e2e_test.cc.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/server_credentials.h>
#include <gtest/gtest.h>

#include "absl/random/random.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "recal/internal/v1/inspection.grpc.pb.h"
#include "server/jobs/model_registry.h"
#include "server/relay/endpoint_heartbeat.h"
#include "server/relay/inspection_service.h"
#include "server/relay/internal_endpoint.h"
#include "server/relay/relay_client.h"
#include "server/relay/remote_inspector.h"
#include "server/store/local_blob_store.h"
#include "server/store/sqlite_metadata_store.h"
#include "tests/test_util.h"

namespace recal::relay {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
namespace fs = std::filesystem;

constexpr int64_t kMaxModelBytes = 8 << 20;
constexpr int kMaxMessageBytes = 1 << 20;  // small: an archive of a few MiB takes several chunks

// What the worker's sandboxed inspection would answer; it keeps the bytes it was given. Its
// host's room (Reserve) is counted while held, or refused as a full host refuses it.
class RecordingInspector final : public jobs::ModelInspector {
 public:
  class CountedRoom final : public Room {
   public:
    explicit CountedRoom(RecordingInspector* inspector) : inspector_(inspector) { ++inspector_->rooms_held; }
    ~CountedRoom() override { --inspector_->rooms_held; }
    absl::StatusOr<v1::Model> Inspect(const std::string& model_path) override {
      return inspector_->InspectInRoom(model_path);
    }

   private:
    RecordingInspector* const inspector_;
  };

  absl::StatusOr<std::unique_ptr<Room>> Reserve(int64_t archive_bytes) override {
    reserved_for = archive_bytes;
    if (!room_verdict.ok()) return room_verdict;
    return std::make_unique<CountedRoom>(this);
  }

  absl::Status room_verdict;  // what Reserve answers (a full host: RESOURCE_EXHAUSTED)
  std::atomic<int> rooms_held{0};
  std::atomic<int64_t> reserved_for{0};
  absl::Status verdict;
  absl::Notification* hold = nullptr;  // set: the inspection waits for it (a slow model)
  // As WorkerRunner's: the host's room first, then the inspection in it.
  absl::StatusOr<v1::Model> Inspect(const std::string& model_path) override {
    if (!room_verdict.ok()) return room_verdict;
    return InspectInRoom(model_path);
  }
  absl::StatusOr<v1::Model> InspectInRoom(const std::string& model_path) {
    if (hold != nullptr) hold->WaitForNotification();
    std::lock_guard<std::mutex> lock(mu);
    ++calls_;
    seen_ = testing::ReadBytes(model_path);
    if (!verdict.ok()) return verdict;
    v1::Model model;
    v1::BatchNormLayer* layer = model.add_layers();
    layer->set_name("features.1");
    layer->set_channels(32);
    v1::ModelInput* input = model.add_inputs();
    input->set_name("x");
    input->add_dims()->set_fixed(3);
    return model;
  }
  // Read under the lock: the test thread learns of an inspection through gRPC's sockets,
  // an order ThreadSanitizer cannot see.
  int calls() {
    std::lock_guard<std::mutex> lock(mu);
    return calls_;
  }
  std::string seen() {
    std::lock_guard<std::mutex> lock(mu);
    return seen_;
  }

 private:
  std::mutex mu;
  int calls_ = 0;
  std::string seen_;
};

RelaySecret SecretIn(const testing::TempDir& dir, const std::string& name, const std::string& value) {
  testing::WriteBytes(dir.File(name), value + "\n");
  return *RelaySecret::FromFile(dir.File(name));
}

std::string RandomBytes(size_t n) {
  absl::BitGen random;
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(absl::Uniform<int>(random, 0, 256));
  return bytes;
}

class RemoteInspectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metadata_ = *store::SqliteMetadataStore::Open(tmp_.File("recal.db"));
    fs::create_directories(scratch());
    service_ = std::make_unique<InspectionService>(SecretIn(tmp_, "secret", kSecret), &inspector_,
                                                   InspectionServiceOptions{kMaxModelBytes, scratch()});
    auto served = ServeInternal("127.0.0.1:0", "", grpc::InsecureServerCredentials(), {service_.get()},
                                kMaxMessageBytes);
    ASSERT_TRUE(served.ok()) << served.status();
    worker_ = *std::move(served);
    client_ = *RelayClient::Make(SecretIn(tmp_, "secret-api", kSecret), {.max_message_bytes = kMaxMessageBytes});
  }
  void TearDown() override {
    if (worker_.server) worker_.server->Shutdown();
  }

  std::string scratch() const { return tmp_.File("scratch"); }
  // The worker says it is up, as its heartbeat does.
  void Heard(const std::string& owner, const std::string& address, absl::Duration ago = absl::ZeroDuration()) {
    ASSERT_TRUE(metadata_->PutWorkerEndpoint(owner, address, absl::ToUnixMillis(absl::Now() - ago)).ok());
  }
  std::string Staged(const std::string& bytes) {
    const std::string path = tmp_.File(absl::StrCat("staged-", ++staged_));
    testing::WriteBytes(path, bytes);
    return path;
  }
  // A call on the worker's endpoint as an attacker makes it: any secret, any messages.
  grpc::Status CallDirectly(const std::string& secret, const std::vector<internal::v1::InspectModelRequest>& messages) {
    auto stub = internal::v1::ModelInspection::NewStub(
        grpc::CreateChannel(worker_.advertised, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    if (!secret.empty()) context.AddMetadata("x-recal-cluster-secret", secret);
    internal::v1::InspectModelResponse response;
    auto writer = stub->InspectModel(&context, &response);
    for (const auto& message : messages) {
      if (!writer->Write(message)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }
  static internal::v1::InspectModelRequest Size(int64_t size) {
    internal::v1::InspectModelRequest message;
    message.set_size(size);
    return message;
  }
  static internal::v1::InspectModelRequest Chunk(const std::string& bytes) {
    internal::v1::InspectModelRequest message;
    message.set_chunk(bytes);
    return message;
  }

  const std::string kSecret = "a-cluster-secret-of-more-than-32-characters";
  testing::TempDir tmp_;
  std::unique_ptr<store::MetadataStore> metadata_;
  RecordingInspector inspector_;
  // What a slow model's inspection waits for; outlives the worker's handler (TearDown).
  absl::Notification slow_model_;
  std::unique_ptr<InspectionService> service_;
  InternalEndpoint worker_;
  std::unique_ptr<RelayClient> client_;
  int staged_ = 0;
};

TEST_F(RemoteInspectionTest, AnArchiveGoesInChunksToALiveWorkerWhoseLayersComeBackAndWhoKeepsNothing) {
  Heard("w1", worker_.advertised);
  const std::string archive = RandomBytes(3 * kMaxMessageBytes + 12345);  // several chunks, the last short
  RemoteInspector remote(client_.get(), metadata_.get());
  auto layers = remote.Inspect(Staged(archive));
  ASSERT_TRUE(layers.ok()) << layers.status();
  ASSERT_EQ(layers->layers_size(), 1);
  EXPECT_EQ(layers->layers(0).name(), "features.1");
  EXPECT_EQ(layers->layers(0).channels(), 32);
  ASSERT_EQ(layers->inputs_size(), 1);  // the input contract travels with the layers
  EXPECT_EQ(layers->inputs(0).name(), "x");
  EXPECT_EQ(layers->inputs(0).dims(0).fixed(), 3);
  EXPECT_EQ(inspector_.seen(), archive) << "the worker inspected other bytes than the api staged";
  EXPECT_TRUE(fs::is_empty(scratch())) << "the received archive is removed after its inspection";
}

TEST_F(RemoteInspectionTest, ARefusalComesBackWithTheInspectionsOwnCodeAndMessage) {
  Heard("w1", worker_.advertised);
  inspector_.verdict = absl::InvalidArgumentError("graph validation: operator aten::from_file is not allowed");
  RemoteInspector remote(client_.get(), metadata_.get());
  auto layers = remote.Inspect(Staged("not much of a model"));
  EXPECT_EQ(layers.status(), inspector_.verdict);
  EXPECT_TRUE(fs::is_empty(scratch()));
}

TEST_F(RemoteInspectionTest, WithoutTheSecretOrWithAWrongOneTheCallIsRefusedAndNothingIsWritten) {
  for (const std::string& secret : {std::string(), std::string("a-wrong-secret-of-more-than-32-characters"),
                                    kSecret.substr(0, kSecret.size() - 1)}) {
    const grpc::Status status = CallDirectly(secret, {Size(5), Chunk("bytes")});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "secret '" << secret << "'";
  }
  EXPECT_EQ(inspector_.calls(), 0);
  EXPECT_TRUE(fs::is_empty(scratch()));
  // An api replica given another secret is told what is wrong, and the worker is passed over.
  Heard("w1", worker_.advertised);
  auto other = *RelayClient::Make(SecretIn(tmp_, "other", "another-cluster-secret-of-32-characters"), {});
  RemoteInspector remote(other.get(), metadata_.get());
  auto layers = remote.Inspect(Staged("a model"));
  EXPECT_EQ(layers.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(layers.status().message(), HasSubstr("same --internal_token_file"));
  EXPECT_EQ(inspector_.calls(), 0);
}

TEST_F(RemoteInspectionTest, AnArchiveOverTheLimitOrNotItsDeclaredSizeIsRefusedAndNothingIsKept) {
  // Over --max_model_bytes: refused at the size, before a byte is written.
  grpc::Status status = CallDirectly(kSecret, {Size(kMaxModelBytes + 1), Chunk("x")});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("--max_model_bytes"));
  // A small size, then more bytes than that (up to past the limit): refused at the first too many.
  const std::string half(kMaxMessageBytes / 2, 'x');
  std::vector<internal::v1::InspectModelRequest> flood = {Size(10)};
  for (int64_t sent = 0; sent <= kMaxModelBytes; sent += half.size()) flood.push_back(Chunk(half));
  status = CallDirectly(kSecret, flood);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("past its declared size"));
  // Fewer bytes than declared; no size first; a size that is no size.
  status = CallDirectly(kSecret, {Size(10), Chunk("12345")});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("after 5 of its declared 10"));
  EXPECT_EQ(CallDirectly(kSecret, {Chunk("12345")}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(CallDirectly(kSecret, {Size(0)}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(CallDirectly(kSecret, {Size(-1), Chunk("1")}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(inspector_.calls(), 0);
  EXPECT_TRUE(fs::is_empty(scratch()));
}

TEST_F(RemoteInspectionTest, AnUnreachableWorkerIsPassedOverForALiveOne) {
  // A worker that went away without a word (its port closed), heard from just now.
  Heard("w-gone", "127.0.0.1:1");
  Heard("w1", worker_.advertised, absl::Seconds(5));
  RemoteInspector remote(client_.get(), metadata_.get());
  for (int i = 0; i < 4; ++i) {  // whichever of the two is tried first
    auto layers = remote.Inspect(Staged("a model"));
    EXPECT_TRUE(layers.ok()) << layers.status();
  }
  EXPECT_EQ(inspector_.calls(), 4);
}

TEST_F(RemoteInspectionTest, WithNoLiveWorkerTheUploadIsUnavailableNamingWhatToStart) {
  const std::string hint =
      "no worker process is reachable to inspect the upload: start a --role=worker with --internal_token_file";
  RemoteInspector remote(client_.get(), metadata_.get());
  // None ever heard from; one heard from too long ago; one that cannot be reached.
  auto layers = remote.Inspect(Staged("a model"));
  EXPECT_EQ(layers.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(layers.status().message(), HasSubstr(hint));
  Heard("w-old", worker_.advertised, store::kWorkerEndpointLiveWithin + absl::Seconds(10));
  layers = remote.Inspect(Staged("a model"));
  EXPECT_EQ(layers.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(layers.status().message(), HasSubstr(hint));
  Heard("w-gone", "127.0.0.1:1");
  layers = remote.Inspect(Staged("a model"));
  EXPECT_EQ(layers.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(layers.status().message(), HasSubstr(hint));
  EXPECT_THAT(layers.status().message(), HasSubstr("127.0.0.1:1"));
  EXPECT_EQ(inspector_.calls(), 0);
}

TEST_F(RemoteInspectionTest, AnApiReplicaShuttingDownMidInspectionAnswersUnavailableNotARefusal) {
  Heard("w1", worker_.advertised);
  inspector_.hold = &slow_model_;
  RemoteInspector remote(client_.get(), metadata_.get());
  const std::string staged = Staged("a model");
  absl::StatusOr<v1::Model> layers;
  absl::Notification answered;
  std::thread upload([&] {
    layers = remote.Inspect(staged);
    answered.Notify();
  });
  absl::SleepFor(absl::Milliseconds(200));  // the archive is at the worker, being inspected
  client_->CloseAll();                       // what JobManager::Shutdown does
  const bool without_the_worker = answered.WaitForNotificationWithTimeout(absl::Seconds(10));
  slow_model_.Notify();
  upload.join();
  EXPECT_TRUE(without_the_worker) << "the shutdown waited for the worker's inspection";
  EXPECT_EQ(layers.status().code(), absl::StatusCode::kUnavailable) << layers.status();
  EXPECT_THAT(layers.status().message(), HasSubstr("shutting down"));
}

// Issue 49 item 5: the worker's host room is taken before the api replica sends a byte, and
// held for as long as the call is open: a full host refuses the reservation itself.
TEST_F(RemoteInspectionTest, TheWorkersRoomIsTakenFirstHeldWhileTheCallIsOpenAndGivenBackAfter) {
  Heard("w1", worker_.advertised);
  RemoteInspector remote(client_.get(), metadata_.get());
  const std::string staged = Staged("a model of 25 bytes......");
  absl::StatusOr<std::unique_ptr<jobs::ModelInspector::Room>> room = remote.Reserve(25);
  ASSERT_TRUE(room.ok()) << room.status();
  EXPECT_EQ(inspector_.rooms_held, 1);
  EXPECT_EQ(inspector_.reserved_for, 25);
  EXPECT_EQ(inspector_.calls(), 0) << "nothing inspected yet: the api replica commits first";
  auto layers = (*room)->Inspect(staged);
  ASSERT_TRUE(layers.ok()) << layers.status();
  EXPECT_EQ(inspector_.seen(), "a model of 25 bytes......");
  room->reset();
  EXPECT_TRUE(fs::is_empty(scratch()));

  // A room the api replica gives up (its commit failed) goes back without an inspection.
  room = remote.Reserve(25);
  ASSERT_TRUE(room.ok()) << room.status();
  EXPECT_EQ(inspector_.rooms_held, 1);
  room->reset();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (inspector_.rooms_held > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(inspector_.rooms_held, 0) << "the worker still holds the room of a call that ended";
  EXPECT_EQ(inspector_.calls(), 1);
}

TEST_F(RemoteInspectionTest, AFullWorkerHostRefusesTheRoomWithItsOwnCodeAndNothingIsSent) {
  Heard("w1", worker_.advertised);
  inspector_.room_verdict = absl::ResourceExhaustedError(
      "no inspection slot on this host within 120 s (--max_concurrent_inspections=4); Retry the upload");
  RemoteInspector remote(client_.get(), metadata_.get());
  absl::StatusOr<std::unique_ptr<jobs::ModelInspector::Room>> room = remote.Reserve(25);
  EXPECT_EQ(room.status(), inspector_.room_verdict);
  auto layers = remote.Inspect(Staged("a model"));
  EXPECT_EQ(layers.status(), inspector_.room_verdict);
  EXPECT_EQ(inspector_.calls(), 0);
  EXPECT_TRUE(fs::is_empty(scratch())) << "no archive was sent";
}

// The orphan blob of docs/known-gaps.md: an api replica's upload that the worker's host bound
// refuses is refused while still staged (resumable, counted, expiring), never committed into
// a blob no model refers to; once the host has room, finishing it again stores the model.
TEST_F(RemoteInspectionTest, AnUploadAFullWorkerRefusesStaysStagedAndLeavesNoBlob) {
  Heard("w1", worker_.advertised);
  auto blobs = *store::LocalBlobStore::Open(tmp_.File("api-blobs"));
  RemoteInspector remote(client_.get(), metadata_.get());
  jobs::ModelRegistry models(metadata_.get(), blobs.get(), kMaxModelBytes, &remote);
  const std::string archive = RandomBytes(3 * kMaxMessageBytes + 7);
  v1::UploadHeader header;
  header.set_size(static_cast<int64_t>(archive.size()));
  header.set_sha256(Sha256Hex(archive));
  ASSERT_TRUE(models.StartUpload("t", header).ok());
  v1::UploadChunk chunk;
  chunk.set_data(archive);
  ASSERT_TRUE(models.AppendChunk("t", header, chunk).ok());

  inspector_.room_verdict = absl::ResourceExhaustedError("no inspection slot on this host; Retry the upload");
  absl::StatusOr<v1::Model> refused = models.FinishUpload("t", header);
  EXPECT_EQ(refused.status(), inspector_.room_verdict);
  EXPECT_FALSE(blobs->Has(header.sha256())) << "a refused upload left a blob that no model refers to";
  EXPECT_EQ(models.UploadStatus("t", header.sha256())->committed_size(), header.size());
  EXPECT_EQ(models.Usage("t")->reserved_bytes(), header.size());

  inspector_.room_verdict = absl::OkStatus();
  absl::StatusOr<v1::Model> stored = models.FinishUpload("t", header);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(inspector_.seen(), archive);
  EXPECT_TRUE(blobs->Has(header.sha256()));
  EXPECT_EQ(models.Usage("t")->reserved_bytes(), 0);
}

TEST_F(RemoteInspectionTest, AHeartbeatMakesAWorkerLiveUntilItStops) {
  const auto live = [&] {
    return *metadata_->LiveWorkerEndpoints(absl::ToUnixMillis(absl::Now() - store::kWorkerEndpointLiveWithin));
  };
  EXPECT_THAT(live(), IsEmpty());
  EndpointHeartbeat heartbeat(metadata_.get(), "w1", worker_.advertised, absl::Milliseconds(50));
  heartbeat.Start();
  EXPECT_THAT(live(), ::testing::ElementsAre(worker_.advertised)) << "live from the start, not a beat later";
  RemoteInspector remote(client_.get(), metadata_.get());
  EXPECT_TRUE(remote.Inspect(Staged("a model")).ok());
  heartbeat.Stop();
  EXPECT_THAT(live(), IsEmpty()) << "a stopped worker is sent no more inspections";
  EXPECT_EQ(remote.Inspect(Staged("a model")).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace recal::relay
