// max_stored_bytes under concurrency (issue 49 item 1) and the disk floor (item 2), through
// ModelRegistry on both metadata backends (SQLite; PostgreSQL, a throwaway server, skipped
// saying why without one) and a fake runner whose inspection a test can hold: an upload's
// bytes count from its start until its model row exists or it is refused, never nowhere;
// uploads racing for a tenant's last bytes, in one process or on two "replicas" with their own
// staging, never store more than the quota; a job's results are reserved before they are
// stored. The disk floor is tried with an injected free-space reading, and a full disk on a
// real tmpfs (root only: mount).
#include <sys/mount.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/sha256.h"
#include "server/jobs/model_registry.h"
#include "server/jobs/retention_sweeper.h"
#include "server/store/disk_floor.h"
#include "server/store/local_blob_store.h"
#include "tests/jobs/fake_runner.h"
#include "tests/store/postgres_server.h"

namespace recal::jobs {
namespace {

using ::recal::testing::PostgresServer;
using ::recal::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

v1::UploadHeader HeaderOf(const std::string& bytes) {
  v1::UploadHeader header;
  header.set_name("m");
  header.set_size(static_cast<int64_t>(bytes.size()));
  header.set_sha256(Sha256Hex(bytes));
  return header;
}

v1::UploadChunk ChunkOf(const std::string& bytes, int64_t offset = 0) {
  v1::UploadChunk chunk;
  chunk.set_offset(offset);
  chunk.set_data(bytes);
  return chunk;
}

// Starts an upload of `bytes` and stages their first `staged` only (a client that went away).
absl::Status StagePart(ModelRegistry& models, const std::string& tenant, const std::string& bytes, size_t staged) {
  const v1::UploadHeader header = HeaderOf(bytes);
  absl::StatusOr<std::optional<v1::Model>> started = models.StartUpload(tenant, header);
  if (!started.ok()) return started.status();
  return models.AppendChunk(tenant, header, ChunkOf(bytes.substr(0, staged)));
}

// Starts an upload of `bytes` and stages them all; the status of the first step that failed.
absl::Status Stage(ModelRegistry& models, const std::string& tenant, const std::string& bytes) {
  return StagePart(models, tenant, bytes, bytes.size());
}

// The whole upload: the model, or the status of the first step that failed.
absl::StatusOr<v1::Model> Upload(ModelRegistry& models, const std::string& tenant, const std::string& bytes) {
  if (absl::Status staged = Stage(models, tenant, bytes); !staged.ok()) return staged;
  return models.FinishUpload(tenant, HeaderOf(bytes));
}

// `n` bytes that are a model of their own (`seed` picks which).
std::string ModelBytes(int n, int seed) {
  std::string bytes = absl::StrCat("model ", seed, " ");
  bytes.resize(static_cast<size_t>(n), static_cast<char>('a' + seed % 26));
  return bytes;
}

// One process of the server, as far as the quota is concerned: its own connection to the
// store, its own staging, its own registry; the runner is shared (it only answers).
struct Replica {
  std::unique_ptr<store::MetadataStore> metadata;
  std::unique_ptr<store::LocalBlobStore> blobs;
  std::unique_ptr<ModelRegistry> models;
};

class StoredBytesQuotaTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "postgresql") {
      absl::StatusOr<PostgresServer*> server = PostgresServer::Shared();
      if (absl::IsNotFound(server.status())) GTEST_SKIP() << server.status().message();
      ASSERT_TRUE(server.ok()) << server.status();
      absl::StatusOr<std::string> uri = (*server)->NewDatabase();
      ASSERT_TRUE(uri.ok()) << uri.status();
      spec_ = *uri;
    } else {
      spec_ = absl::StrCat("sqlite:", tmp_.File("recal.db"));
    }
    replica_ = MakeReplica("blobs");
  }

  Replica MakeReplica(const std::string& blob_dir) {
    Replica replica;
    replica.metadata = *store::OpenMetadataStore(spec_);
    replica.blobs = *store::LocalBlobStore::Open(tmp_.File(blob_dir));
    replica.models = std::make_unique<ModelRegistry>(replica.metadata.get(), replica.blobs.get(), 1 << 20, &runner_,
                                                     [this](const std::string&) {
                                                       TenantLimits limits;
                                                       limits.max_stored_bytes = quota_;
                                                       return limits;
                                                     });
    return replica;
  }
  ModelRegistry& models() { return *replica_.models; }
  v1::Usage UsageOf(const std::string& tenant) {
    absl::StatusOr<v1::Usage> usage = models().Usage(tenant);
    EXPECT_TRUE(usage.ok()) << usage.status();
    return usage.ok() ? *usage : v1::Usage();
  }
  // The bytes of the tenant's stored models, as listed (what the quota must bound).
  int64_t ModelBytesOf(const std::string& tenant) {
    const absl::StatusOr<store::ModelPage> page = replica_.metadata->ListModels(tenant, 1000, "", "");
    EXPECT_TRUE(page.ok()) << page.status();
    int64_t bytes = 0;
    if (page.ok()) {
      for (const v1::Model& model : page->models) bytes += model.size();
    }
    return bytes;
  }
  // The first inspection waits, once `inspecting` is notified, until `release` is.
  void HoldTheFirstInspection() {
    runner_.before_inspect = [this]() -> absl::Status {
      if (!inspecting_.HasBeenNotified()) {
        inspecting_.Notify();
        release_.WaitForNotification();
      }
      return absl::OkStatus();
    };
  }

  TempDir tmp_;
  std::string spec_;
  FakeRunner runner_;
  std::atomic<int64_t> quota_{0};
  Replica replica_;
  absl::Notification inspecting_, release_;
};

// The window of issue 49: the first upload's staged file has become a blob and is being
// inspected, its model row not written yet. A second upload started then must find those
// bytes counted.
TEST_P(StoredBytesQuotaTest, AnUploadStartedWhileAnotherIsInspectedFindsItsBytesCounted) {
  quota_ = 100;
  HoldTheFirstInspection();
  const std::string first = ModelBytes(60, 1);
  absl::StatusOr<v1::Model> first_done;
  ASSERT_TRUE(Stage(models(), "t", first).ok());
  std::thread finishing([&] { first_done = models().FinishUpload("t", HeaderOf(first)); });
  inspecting_.WaitForNotification();
  EXPECT_EQ(replica_.blobs->UploadUsageOf("t")->bytes, 0) << "the first upload is committed, not staged";

  const absl::Status second = Stage(models(), "t", ModelBytes(50, 2));
  EXPECT_TRUE(absl::IsResourceExhausted(second)) << second;
  EXPECT_THAT(second.message(),
              AllOf(HasSubstr("max_stored_bytes=100"), HasSubstr("unfinished uploads and results being stored 60"),
                    HasSubstr("this upload 50")));
  const v1::Usage during = UsageOf("t");
  EXPECT_EQ(during.reserved_bytes(), 60);
  EXPECT_EQ(during.stored_bytes(), 60);

  release_.Notify();
  finishing.join();
  ASSERT_TRUE(first_done.ok()) << first_done.status();
  const v1::Usage after = UsageOf("t");
  EXPECT_EQ(after.model_bytes(), 60);
  EXPECT_EQ(after.reserved_bytes(), 0) << "the reservation became the model's row";
  EXPECT_TRUE(absl::IsResourceExhausted(Stage(models(), "t", ModelBytes(50, 2))));
  EXPECT_TRUE(Upload(models(), "t", ModelBytes(40, 3)).ok());
  EXPECT_EQ(ModelBytesOf("t"), 100);
}

// Uploads begun at once, before either sent a byte: the second finds the first's whole size
// counted, not the nothing it has staged yet.
TEST_P(StoredBytesQuotaTest, UploadsBegunAtOnceCannotBothTakeTheLastBytes) {
  quota_ = 100;
  ASSERT_TRUE(models().StartUpload("t", HeaderOf(ModelBytes(60, 1))).ok());
  const absl::Status second = models().StartUpload("t", HeaderOf(ModelBytes(50, 2))).status();
  EXPECT_TRUE(absl::IsResourceExhausted(second)) << second;
  // The first resumed (its header again) is still its own 60 bytes, not 120.
  EXPECT_TRUE(models().StartUpload("t", HeaderOf(ModelBytes(60, 1))).ok());
  EXPECT_TRUE(Upload(models(), "t", ModelBytes(40, 3)).ok());
}

// The red team's 24 concurrent small uploads against a quota of a few of them, sent through
// two replicas (their own store connection and staging): whatever the interleaving, the
// models stored never pass the quota, every refusal is RESOURCE_EXHAUSTED naming it, and
// usage never reads more than the quota while they race.
TEST_P(StoredBytesQuotaTest, ManyConcurrentUploadsThroughTwoReplicasNeverStoreMoreThanTheQuota) {
  constexpr int kUploads = 24;
  constexpr int kBytes = 1570;
  quota_ = 6000;  // room for 3 of them
  Replica other = MakeReplica("other-blobs");
  std::atomic<bool> racing{true};
  std::atomic<int64_t> most_seen{0};
  std::thread watcher([&] {
    while (racing) {
      if (auto usage = models().Usage("t"); usage.ok()) {
        most_seen = std::max<int64_t>(most_seen, usage->stored_bytes());
      }
    }
  });
  std::atomic<int> accepted{0}, refused{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> uploads;
  for (int i = 0; i < kUploads; ++i) {
    uploads.emplace_back([&, i] {
      ModelRegistry& registry = i % 2 == 0 ? models() : *other.models;
      ++ready;
      while (ready < kUploads) std::this_thread::yield();
      absl::StatusOr<v1::Model> model = Upload(registry, "t", ModelBytes(kBytes, i));
      if (model.ok()) {
        ++accepted;
      } else if (absl::IsResourceExhausted(model.status())) {
        EXPECT_THAT(model.status().message(), HasSubstr("max_stored_bytes=6000"));
        ++refused;
      } else {
        ADD_FAILURE() << model.status();
      }
    });
  }
  for (std::thread& upload : uploads) upload.join();
  racing = false;
  watcher.join();
  EXPECT_EQ(accepted + refused, kUploads);
  EXPECT_EQ(accepted.load(), 3) << "the quota has room for 3 and nothing else holds any";
  EXPECT_LE(ModelBytesOf("t"), quota_.load());
  EXPECT_LE(most_seen.load(), quota_.load());
  const v1::Usage usage = UsageOf("t");
  EXPECT_EQ(usage.stored_bytes(), ModelBytesOf("t"));
  EXPECT_EQ(usage.reserved_bytes(), 0) << "every reservation became a model or was refused";
}

TEST_P(StoredBytesQuotaTest, ARefusedModelLeavesNeitherItsBytesNorItsReservation) {
  quota_ = 100;
  runner_.before_inspect = [] { return absl::InvalidArgumentError("operator aten::from_file is not allowed"); };
  const std::string bytes = ModelBytes(60, 1);
  absl::StatusOr<v1::Model> refused = Upload(models(), "t", bytes);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_FALSE(replica_.blobs->Has(Sha256Hex(bytes)));
  EXPECT_EQ(UsageOf("t").stored_bytes(), 0);
}

// A digest that does not match discards the staged bytes at the commit: the reservation too.
TEST_P(StoredBytesQuotaTest, ACorruptUploadLeavesNoReservation) {
  quota_ = 100;
  const std::string bytes = ModelBytes(60, 1);
  v1::UploadHeader header = HeaderOf(bytes);
  header.set_sha256(Sha256Hex("other bytes"));
  ASSERT_TRUE(models().StartUpload("t", header).ok());
  ASSERT_TRUE(models().AppendChunk("t", header, ChunkOf(bytes)).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(models().FinishUpload("t", header).status()));
  EXPECT_EQ(UsageOf("t").stored_bytes(), 0);
}

// Refused for want of an inspection slot, the upload is no verdict: it stays staged and
// counted, and finishing it again stores it.
TEST_P(StoredBytesQuotaTest, AnUploadAFullHostRefusesStaysStagedAndCounted) {
  quota_ = 100;
  runner_.reserve = [] { return absl::ResourceExhaustedError("no room (--max_concurrent_inspections)"); };
  const std::string bytes = ModelBytes(60, 1);
  EXPECT_TRUE(absl::IsResourceExhausted(Upload(models(), "t", bytes).status()));
  EXPECT_EQ(UsageOf("t").reserved_bytes(), 60);
  EXPECT_EQ(UsageOf("t").upload_bytes(), 60);
  runner_.reserve = nullptr;
  EXPECT_TRUE(models().FinishUpload("t", HeaderOf(bytes)).ok());
  EXPECT_EQ(UsageOf("t").stored_bytes(), 60);
  EXPECT_EQ(UsageOf("t").reserved_bytes(), 0);
}

// A restart finds the reservations of uploads it staged (they resume); one nobody touches
// for upload_idle goes with its staged bytes, so none is left behind for good.
TEST_P(StoredBytesQuotaTest, ReservationsOutliveARestartAndExpireWithTheirIdleUploads) {
  quota_ = 100;
  ASSERT_TRUE(StagePart(models(), "t", ModelBytes(60, 1), 10).ok());
  replica_ = Replica();  // the process ends
  replica_ = MakeReplica("blobs");
  EXPECT_EQ(UsageOf("t").reserved_bytes(), 60);
  EXPECT_TRUE(absl::IsResourceExhausted(models().StartUpload("t", HeaderOf(ModelBytes(50, 2))).status()));

  absl::Time now = absl::Now();
  SweeperOptions options;
  options.upload_idle = absl::Hours(1);
  options.now = [&now] { return now; };
  RetentionSweeper sweeper(replica_.metadata.get(), replica_.blobs.get(), options);
  now += options.upload_idle + store::kReservationTouchEvery + absl::Seconds(1);
  absl::StatusOr<SweepCounts> swept = sweeper.SweepOnce();
  ASSERT_TRUE(swept.ok()) << swept.status();
  EXPECT_EQ(swept->uploads_expired, 1);
  EXPECT_EQ(swept->reservations_expired, 1);
  EXPECT_EQ(UsageOf("t").stored_bytes(), 0);
}

// An upload whose reservation expired while it sat idle takes it again, checked, with its
// next chunk.
TEST_P(StoredBytesQuotaTest, AChunkAfterTheReservationExpiredTakesItAgainChecked) {
  quota_ = 100;
  const std::string bytes = ModelBytes(60, 1);
  const v1::UploadHeader header = HeaderOf(bytes);
  ASSERT_TRUE(StagePart(models(), "t", bytes, 10).ok());
  ASSERT_EQ(*replica_.metadata->ExpireReservations(absl::ToUnixMillis(absl::Now()) + 1), 1);
  ASSERT_TRUE(Upload(models(), "t", ModelBytes(50, 2)).ok());  // took the room meanwhile
  const absl::Status next = models().AppendChunk("t", header, ChunkOf(bytes.substr(10), 10));
  EXPECT_TRUE(absl::IsResourceExhausted(next)) << next;
  EXPECT_LE(UsageOf("t").stored_bytes(), 100);
}

// A stream that ends before its upload is finished: with nothing staged, the upload holds
// nothing (as if never begun); with bytes staged, it keeps its reservation for the resume.
TEST_P(StoredBytesQuotaTest, AnUploadLeftWithNothingStagedHoldsNoReservation) {
  quota_ = 100;
  const std::string bytes = ModelBytes(60, 1);
  const v1::UploadHeader header = HeaderOf(bytes);
  ASSERT_TRUE(models().StartUpload("t", header).ok());
  models().LeaveUpload("t", header);
  EXPECT_EQ(UsageOf("t").reserved_bytes(), 0);
  ASSERT_TRUE(StagePart(models(), "t", bytes, 10).ok());
  models().LeaveUpload("t", header);
  EXPECT_EQ(UsageOf("t").reserved_bytes(), 60);
}

// Clients uploading the same bytes share one reservation; the first to finish turns it into
// the model, and the other is told to ask again rather than reserving the bytes twice.
TEST_P(StoredBytesQuotaTest, ClientsOfTheSameBytesShareOneReservationAndTheLaterOneIsToldToAskAgain) {
  quota_ = 100;
  const std::string bytes = ModelBytes(60, 1);
  const v1::UploadHeader header = HeaderOf(bytes);
  ASSERT_TRUE(models().StartUpload("t", header).ok());
  ASSERT_TRUE(models().StartUpload("t", header).ok());  // another rank, the same bytes
  EXPECT_EQ(UsageOf("t").reserved_bytes(), 60);
  ASSERT_TRUE(Upload(models(), "t", bytes).ok());
  const absl::Status late = models().AppendChunk("t", header, ChunkOf(bytes));
  EXPECT_TRUE(absl::IsFailedPrecondition(late)) << late;
  EXPECT_THAT(late.message(), HasSubstr("GetUploadStatus"));
  EXPECT_EQ(UsageOf("t").stored_bytes(), 60);
  EXPECT_EQ(UsageOf("t").upload_bytes(), 0);
}

// A job's results are reserved before they enter the blob store: past the quota the job is
// refused them, saying so; within it they count until the job's row holds them.
TEST_P(StoredBytesQuotaTest, AJobsResultsAreReservedBeforeTheyAreStored) {
  quota_ = 100;
  ASSERT_TRUE(Upload(models(), "t", ModelBytes(60, 1)).ok());
  v1::Job job;
  job.set_id("job-1");
  job.set_tenant("t");
  job.set_state(v1::RUNNING);
  job.mutable_spec()->set_model_id("sha256:m");
  ASSERT_TRUE(replica_.metadata->CreateJob(job, nullptr).ok());
  const std::filesystem::path scratch = tmp_.File("scratch");
  std::filesystem::create_directories(scratch);
  testing::WriteBytes((scratch / "model.pt").string(), std::string(45, 'm'));
  const ScratchFiles files = {{v1::MODEL, "model.pt"}};
  const absl::Status refused = models().stored_bytes().ReserveResults(job, scratch, files);
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(), AllOf(HasSubstr("this job's results 45"), HasSubstr("submit the job again")));

  testing::WriteBytes((scratch / "model.pt").string(), std::string(40, 'm'));
  ASSERT_TRUE(models().stored_bytes().ReserveResults(job, scratch, files).ok());
  EXPECT_EQ(UsageOf("t").reserved_bytes(), 40);
  EXPECT_TRUE(absl::IsResourceExhausted(Stage(models(), "t", ModelBytes(1, 2)))) << "the results' bytes are held";
  job.set_state(v1::SUCCEEDED);
  ASSERT_TRUE(replica_.metadata->CommitJob(job, {}, {{v1::MODEL, store::ResultRef{"ab", 40}}}).ok());
  const v1::Usage usage = UsageOf("t");
  EXPECT_EQ(usage.reserved_bytes(), 0);
  EXPECT_EQ(usage.result_bytes(), 40);
  EXPECT_EQ(usage.stored_bytes(), 100);
}

// --------------------------------------------------------------------------- disk floor

TEST_P(StoredBytesQuotaTest, BelowTheDiskFloorUploadBytesAreRefusedNamingTheFlag) {
  std::atomic<int64_t> free{1000};
  const store::DiskFloor floor(tmp_.path(), 500, [&free]() -> absl::StatusOr<int64_t> { return free.load(); });
  models().SetDiskFloor(&floor);
  const absl::Status refused = Stage(models(), "t", ModelBytes(600, 1));
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr("1000 bytes free"), HasSubstr("--min_free_disk_bytes"), HasSubstr("600 more")));
  EXPECT_EQ(UsageOf("t").reserved_bytes(), 0) << "refused before anything was reserved";

  const std::string bytes = ModelBytes(400, 2);
  const v1::UploadHeader header = HeaderOf(bytes);
  ASSERT_TRUE(models().StartUpload("t", header).ok());
  free = 450;  // another writer took the room meanwhile: the next chunk is refused
  EXPECT_TRUE(absl::IsResourceExhausted(models().AppendChunk("t", header, ChunkOf(bytes))));
  free = 1000;
  EXPECT_TRUE(models().AppendChunk("t", header, ChunkOf(bytes)).ok());
  EXPECT_TRUE(models().FinishUpload("t", header).ok());
}

// A small real file system, mounted for the test: tmpfs needs root (CAP_SYS_ADMIN).
class SmallDisk {
 public:
  SmallDisk(const std::string& dir, int64_t bytes) : dir_(dir) {
    std::filesystem::create_directories(dir);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, absl::StrCat("size=", bytes).c_str()) == 0) {
      mounted_ = true;
    } else {
      why_not_ = absl::StrCat("cannot mount a tmpfs (", std::strerror(errno), "): run as root to try a full disk");
    }
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& why_not() const { return why_not_; }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string why_not_;
};

// The 40 MB upload into a 24 MB data dir, scaled down: the chunk that finds the disk full
// ends the upload, its staged bytes and its reservation go, the message says so, and the disk
// is free again for the next upload (which the floor, had it been set, would have refused).
TEST_P(StoredBytesQuotaTest, AChunkThatFindsTheDiskFullRemovesItsUploadAndReservation) {
  SmallDisk disk(tmp_.File("small"), 1 << 20);
  if (!disk.mounted()) GTEST_SKIP() << disk.why_not();
  Replica small;
  small.metadata = *store::OpenMetadataStore(spec_);
  small.blobs = *store::LocalBlobStore::Open(tmp_.File("small/blobs"));
  small.models = std::make_unique<ModelRegistry>(small.metadata.get(), small.blobs.get(), 4 << 20, &runner_);
  const std::string bytes = ModelBytes(2 << 20, 1);
  const v1::UploadHeader header = HeaderOf(bytes);
  ASSERT_TRUE(small.models->StartUpload("t", header).ok());
  absl::Status appended;
  constexpr int64_t kChunk = 256 << 10;
  int64_t offset = 0;
  for (; offset < header.size() && appended.ok(); offset += kChunk) {
    appended = small.models->AppendChunk("t", header, ChunkOf(bytes.substr(offset, kChunk), offset));
  }
  EXPECT_TRUE(absl::IsResourceExhausted(appended)) << appended;
  EXPECT_THAT(appended.message(), AllOf(HasSubstr("disk is full"), HasSubstr("were removed"),
                                        HasSubstr("upload again from offset 0")));
  EXPECT_EQ(*small.blobs->UploadedSize("t", header.sha256()), 0);
  EXPECT_EQ(small.models->Usage("t")->stored_bytes(), 0) << "its reservation went with its bytes";
  EXPECT_GE(*store::FreeBytesAt(tmp_.File("small")), (1 << 20) - (64 << 10)) << "the disk is free again";
  EXPECT_TRUE(Upload(*small.models, "t", ModelBytes(100 << 10, 2)).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, StoredBytesQuotaTest, ::testing::Values("sqlite", "postgresql"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace recal::jobs
