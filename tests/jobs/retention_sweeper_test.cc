// The retention sweeper over the real SQLite and local blob stores, on a fake clock: old
// versions beyond keep_versions go with their bytes, never one a queued or running job uses;
// ended jobs go with their results after keep_results_days; unfinished uploads count toward
// max_stored_bytes until they have been idle for upload_idle, then go.
#include "server/jobs/retention_sweeper.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "google/protobuf/util/time_util.h"
#include "server/jobs/model_registry.h"
#include "server/store/local_blob_store.h"
#include "tests/jobs/fake_runner.h"

namespace recal::jobs {
namespace {

using ::testing::HasSubstr;

class RetentionSweeperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metadata_ = *store::OpenMetadataStore(tmp_.File("recal.db"));
    blobs_ = *store::LocalBlobStore::Open(tmp_.File("blobs"));
    models_ = std::make_unique<ModelRegistry>(metadata_.get(), blobs_.get(), 1 << 20, &runner_,
                                              [this](const std::string&) { return limits_; });
    SweeperOptions options;
    options.retention = [this](const std::string& tenant) { return policies_[tenant]; };
    options.upload_idle = absl::Hours(1);
    options.now = [this] { return now_; };
    sweeper_ = std::make_unique<RetentionSweeper>(metadata_.get(), blobs_.get(), options);
  }

  SweepCounts Sweep() {
    absl::StatusOr<SweepCounts> counts = sweeper_->SweepOnce();
    EXPECT_TRUE(counts.ok()) << counts.status();
    return counts.ok() ? *counts : SweepCounts();
  }
  // The versions of `name` the tenant still has, newest first.
  std::vector<int64_t> Versions(const std::string& tenant, const std::string& name) {
    std::vector<int64_t> versions;
    absl::StatusOr<store::ModelPage> page = metadata_->ListModels(tenant, 0, "", name);
    EXPECT_TRUE(page.ok()) << page.status();
    if (!page.ok()) return versions;
    for (const v1::Model& model : page->models) versions.push_back(model.version());
    return versions;
  }
  bool HasBytesOf(const std::string& model_id) { return blobs_->Has(*DigestOfModelId(model_id)); }
  // An ended job of `tenant` on `model_id` that ended at `ended`, with a result blob.
  std::string EndedJob(const std::string& id, const std::string& model_id, absl::Time ended,
                       v1::JobState state = v1::SUCCEEDED) {
    v1::Job job;
    job.set_id(id);
    job.set_tenant("t");
    job.set_state(state);
    job.mutable_spec()->set_model_id(model_id);
    *job.mutable_end_time() = google::protobuf::util::TimeUtil::MillisecondsToTimestamp(absl::ToUnixMillis(ended));
    EXPECT_TRUE(metadata_->CreateJob(job, nullptr).ok());
    const std::string digest = *blobs_->Put(absl::StrCat("result of ", id));
    EXPECT_TRUE(metadata_->PutResult(id, v1::MODEL, store::ResultRef{digest, 10}).ok());
    return digest;
  }

  testing::TempDir tmp_;
  FakeRunner runner_;
  TenantLimits limits_;
  std::map<std::string, RetentionPolicy> policies_;
  absl::Time now_ = absl::Now();
  std::unique_ptr<store::MetadataStore> metadata_;
  std::unique_ptr<store::LocalBlobStore> blobs_;
  std::unique_ptr<ModelRegistry> models_;
  std::unique_ptr<RetentionSweeper> sweeper_;
};

TEST_F(RetentionSweeperTest, KeepsTheNewestVersionsOfEachNameAndRemovesTheOlderOnesBytes) {
  std::vector<std::string> m;
  for (int i = 1; i <= 4; ++i) m.push_back(UploadAnyModel(*models_, "t", absl::StrCat("m bytes ", i), "m"));
  UploadAnyModel(*models_, "t", "n bytes", "n");
  for (int i = 1; i <= 3; ++i) UploadAnyModel(*models_, "u", absl::StrCat("u bytes ", i), "m");
  policies_["t"].keep_versions = 2;  // "u" keeps everything (0)

  const SweepCounts counts = Sweep();
  EXPECT_EQ(counts.models_deleted, 2);
  EXPECT_EQ(Versions("t", "m"), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(Versions("t", "n"), (std::vector<int64_t>{1}));
  EXPECT_EQ(Versions("u", "m"), (std::vector<int64_t>{3, 2, 1}));
  EXPECT_FALSE(HasBytesOf(m[0]));
  EXPECT_FALSE(HasBytesOf(m[1]));
  EXPECT_TRUE(HasBytesOf(m[2]));
  // A second sweep (or another replica's) finds nothing more to do.
  EXPECT_EQ(Sweep().models_deleted, 0);
  // A new version pushes the oldest kept one out; its number is never reused.
  UploadAnyModel(*models_, "t", "m bytes 5", "m");
  EXPECT_EQ(Sweep().models_deleted, 1);
  EXPECT_EQ(Versions("t", "m"), (std::vector<int64_t>{5, 4}));
}

TEST_F(RetentionSweeperTest, NeverDeletesAVersionAQueuedOrRunningJobUsesAndTakesItOnceTheJobEnds) {
  const std::string old = UploadAnyModel(*models_, "t", "old bytes", "m");
  UploadAnyModel(*models_, "t", "new bytes", "m");
  policies_["t"].keep_versions = 1;
  v1::Job job;
  job.set_id("queued");
  job.set_tenant("t");
  job.set_state(v1::QUEUED);
  job.mutable_spec()->set_model_id(old);
  ASSERT_TRUE(metadata_->CreateJob(job, nullptr).ok());

  SweepCounts counts = Sweep();
  EXPECT_EQ(counts.models_deleted, 0);
  EXPECT_EQ(counts.models_kept_for_jobs, 1);
  EXPECT_EQ(Versions("t", "m"), (std::vector<int64_t>{2, 1}));
  EXPECT_TRUE(HasBytesOf(old));

  v1::JobEvent event;
  job.set_state(v1::RUNNING);
  event.set_state(v1::RUNNING);
  ASSERT_TRUE(metadata_->UpdateJob(job, event).ok());
  EXPECT_EQ(Sweep().models_kept_for_jobs, 1);
  job.set_state(v1::SUCCEEDED);
  event.set_state(v1::SUCCEEDED);
  ASSERT_TRUE(metadata_->UpdateJob(job, event).ok());
  EXPECT_EQ(Sweep().models_deleted, 1);
  EXPECT_EQ(Versions("t", "m"), (std::vector<int64_t>{2}));
  EXPECT_FALSE(HasBytesOf(old));
}

TEST_F(RetentionSweeperTest, EndedJobsGoWithTheirResultsOnceTheirDaysHavePassed) {
  const std::string model = UploadAnyModel(*models_, "t", "bytes", "m");
  const std::string old_result = EndedJob("old", model, now_ - absl::Hours(24 * 3));
  const std::string failed_result = EndedJob("failed", model, now_ - absl::Hours(24 * 3), v1::FAILED);
  const std::string recent_result = EndedJob("recent", model, now_ - absl::Hours(24 * 1));
  v1::Job running;
  running.set_id("running");
  running.set_tenant("t");
  running.set_state(v1::RUNNING);
  running.mutable_spec()->set_model_id(model);
  ASSERT_TRUE(metadata_->CreateJob(running, nullptr).ok());

  EXPECT_EQ(Sweep().jobs_deleted, 0);  // no policy: kept forever
  policies_["t"].keep_results_days = 2;
  EXPECT_EQ(Sweep().jobs_deleted, 2);
  EXPECT_TRUE(absl::IsNotFound(metadata_->GetJob("old").status()));
  EXPECT_TRUE(absl::IsNotFound(metadata_->GetJob("failed").status()));
  EXPECT_FALSE(blobs_->Has(old_result));
  EXPECT_FALSE(blobs_->Has(failed_result));
  EXPECT_TRUE(metadata_->GetJob("recent").ok());
  EXPECT_TRUE(blobs_->Has(recent_result));
  EXPECT_TRUE(metadata_->GetJob("running").ok());
  EXPECT_TRUE(HasBytesOf(model));  // results go, the model stays

  now_ += absl::Hours(24 * 2);  // two days on: "recent" is three days old
  EXPECT_EQ(Sweep().jobs_deleted, 1);
  EXPECT_FALSE(blobs_->Has(recent_result));
  EXPECT_TRUE(metadata_->GetJob("running").ok());
}

// The attack of issue 35: uploads begun and never finished. From their start they count
// toward max_stored_bytes with their whole declared size (no new upload beyond it); idle past
// upload_idle, the sweeper removes them and their reservations, and the tenant may upload
// again.
TEST_F(RetentionSweeperTest, AbandonedUploadsCountTowardTheQuotaUntilTheSweeperExpiresThem) {
  limits_.max_stored_bytes = 5000;
  int started = 0;
  absl::Status refused;
  for (int i = 0; i < 20 && refused.ok(); ++i) {
    const std::string bytes(1024, static_cast<char>('a' + i));
    v1::UploadHeader header;
    header.set_size(static_cast<int64_t>(bytes.size()));
    header.set_sha256(Sha256Hex(bytes));
    refused = models_->StartUpload("t", header).status();
    if (!refused.ok()) break;
    v1::UploadChunk chunk;
    chunk.set_data(bytes.substr(0, 1000));  // never finished
    refused = models_->AppendChunk("t", header, chunk);
    if (refused.ok()) ++started;
  }
  EXPECT_EQ(started, 4);  // 4 x 1024 bytes reserved; a fifth 1024-byte upload would pass 5000
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("unfinished uploads and results being stored 4096"));
  absl::StatusOr<v1::Usage> usage = models_->Usage("t");
  ASSERT_TRUE(usage.ok()) << usage.status();
  EXPECT_EQ(usage->uploads(), 4);
  EXPECT_EQ(usage->upload_bytes(), 4000);
  EXPECT_EQ(usage->reserved_bytes(), 4096);
  EXPECT_EQ(usage->stored_bytes(), 4096);
  EXPECT_EQ(usage->max_stored_bytes(), 5000);

  SweepCounts swept = Sweep();
  EXPECT_EQ(swept.uploads_expired, 0);  // idle for less than upload_idle
  EXPECT_EQ(swept.reservations_expired, 0);
  // Touched at most once a minute, a reservation goes that much after its staged bytes.
  now_ += absl::Hours(1) + absl::Seconds(1);
  swept = Sweep();
  EXPECT_EQ(swept.uploads_expired, 4);
  EXPECT_EQ(swept.reservations_expired, 0);
  EXPECT_EQ(models_->Usage("t")->stored_bytes(), 4096);
  now_ += store::kReservationTouchEvery;
  EXPECT_EQ(Sweep().reservations_expired, 4);
  EXPECT_EQ(models_->Usage("t")->stored_bytes(), 0);
  EXPECT_FALSE(UploadAnyModel(*models_, "t", std::string(1024, 'z'), "m").empty());
}

}  // namespace
}  // namespace recal::jobs
