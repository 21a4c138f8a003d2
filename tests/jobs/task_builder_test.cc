// BuildTask: the one RecalibrationTask of a run (of a job or of a shard) and of a sharded
// job's merge, over the real repository and blob store: what each carries, what the merge is
// given of its shards, and the errors passed up (the data's, for a merge too).
#include "server/jobs/task_builder.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/jobs/job_plan.h"
#include "server/store/local_blob_store.h"
#include "tests/jobs/fake_runner.h"

namespace recal::jobs {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
namespace fs = std::filesystem;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

class TaskBuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metadata_ = *store::OpenMetadataStore(tmp_.File("recal.db"));
    blobs_ = *store::LocalBlobStore::Open(tmp_.File("blobs"));
    models_ = std::make_unique<ModelRegistry>(metadata_.get(), blobs_.get(), 1 << 20, &runner_);
    jobs_ = std::make_unique<JobRepository>(metadata_.get(), &events_);
    model_id_ = UploadAnyModel(*models_);
    ASSERT_FALSE(model_id_.empty());
    data_root_ = fs::canonical(tmp_.path()).string() + "/data";
    fs::create_directories(data_root_);
    testing::WriteBytes(data_root_ + "/x.npy", "not parsed here");
    roots_.Add(data_root_);
    scratch_ = tmp_.File("scratch");
    fs::create_directories(scratch_);
  }

  v1::Job Created(v1::JobSpec spec) {
    v1::Job job;
    job.set_id("job-" + std::to_string(next_id_++));
    job.set_tenant("t");
    spec.set_model_id(model_id_);
    spec.set_batch_size(4);
    *job.mutable_spec() = spec;
    bool created = false;
    const absl::StatusOr<worker::v1::JobPlan> plan = PlanJob(job.spec(), roots_.For("t"));
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *jobs_->Create(job, plan.value_or(worker::v1::JobPlan()), &created);
  }
  static v1::JobSpec TensorFileSpec(const std::string& path) {
    v1::JobSpec spec;
    spec.mutable_data()->mutable_tensor_file()->set_format(v1::TensorFileSource::NPY);
    spec.mutable_data()->mutable_tensor_file()->set_path(path);
    return spec;
  }
  // The shards of `parent`, each SUCCEEDED with `statistics[k]` as its SHARD_STATISTICS.
  std::vector<v1::Job> SucceededShards(const v1::Job& parent, const std::vector<std::string>& statistics) {
    for (size_t k = 0; k < statistics.size(); ++k) {
      const std::string id = ShardJobId(parent.id(), static_cast<int>(k));
      const std::string file = (fs::path(blobs_->scratch_dir()) / ("stats-" + std::to_string(k))).string();
      testing::WriteBytes(file, statistics[k]);
      const std::string digest = *blobs_->AdoptFile(file);
      EXPECT_TRUE(jobs_->Start(id, "cuda:" + std::to_string(k)).ok());
      EXPECT_TRUE(jobs_->Succeed(id, {{v1::SHARD_STATISTICS, {digest, *blobs_->SizeOf(digest)}}}, {}).ok());
    }
    return *jobs_->Children(parent.id());
  }
  absl::StatusOr<RecalibrationTask> Build(const v1::Job& job, const TaskPurpose& purpose) {
    return BuildTask({jobs_.get(), models_.get(), blobs_.get(), &roots_}, job, purpose, scratch_, cancel_);
  }

  testing::TempDir tmp_;
  FakeRunner runner_;
  EventHub events_;
  std::unique_ptr<store::MetadataStore> metadata_;
  std::unique_ptr<store::LocalBlobStore> blobs_;
  std::unique_ptr<ModelRegistry> models_;
  std::unique_ptr<JobRepository> jobs_;
  std::string model_id_;
  std::string data_root_;
  DataRoots roots_;
  fs::path scratch_;
  std::atomic<bool> cancel_{false};
  int next_id_ = 0;
};

TEST_F(TaskBuilderTest, ARunCarriesTheStoredModelTheResolvedDataAndTheTenantsRoots) {
  const v1::Job job = Created(TensorFileSpec("x.npy"));
  absl::StatusOr<RecalibrationTask> task = Build(job, TaskPurpose::Run("cuda:1"));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->model_path, *blobs_->LocalPath(*models_->DigestOf("t", model_id_)));
  EXPECT_EQ(task->plan.data().tensor_file().path(), data_root_ + "/x.npy");
  EXPECT_THAT(task->data_roots, ElementsAre(data_root_));
  EXPECT_EQ(task->device, "cuda:1");
  EXPECT_EQ(task->scratch_dir, scratch_.string());
  EXPECT_EQ(task->plan.SerializeAsString(), jobs_->Plan(job.id())->value().SerializeAsString());
  EXPECT_EQ(task->shard_count, 1);
  EXPECT_THAT(task->merge_statistics, IsEmpty());
}

TEST_F(TaskBuilderTest, AShardsRunCarriesItsIndexAndTheCount) {
  v1::JobSpec spec = TensorFileSpec("x.npy");
  spec.set_shards(3);
  const v1::Job parent = Created(spec);
  const v1::Job shard = *jobs_->Get(ShardJobId(parent.id(), 2));
  absl::StatusOr<RecalibrationTask> task = Build(shard, TaskPurpose::Run("cpu"));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->shard_index, 2);
  EXPECT_EQ(task->shard_count, 3);
}

TEST_F(TaskBuilderTest, AClientStreamsRunCarriesItsStreamAsPlanned) {
  v1::JobSpec spec;
  spec.mutable_data()->mutable_client_stream()->set_scale(255);
  absl::StatusOr<RecalibrationTask> task = Build(Created(spec), TaskPurpose::Run("cpu"));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->plan.data().client_stream().scale(), 255);
}

TEST_F(TaskBuilderTest, AJobStoredBeforePlansIsPlannedWhenItRuns) {
  v1::Job job;
  job.set_id("from-an-older-server");
  job.set_tenant("t");
  *job.mutable_spec() = TensorFileSpec("x.npy");
  job.mutable_spec()->set_model_id(model_id_);
  job.mutable_spec()->set_batch_size(4);
  job.mutable_spec()->mutable_options()->set_compute_dtype("bfloat16");
  bool created = false;
  ASSERT_TRUE(jobs_->Create(job, worker::v1::JobPlan(), &created).ok());
  ASSERT_FALSE(jobs_->Plan(job.id())->has_value());
  absl::StatusOr<RecalibrationTask> task = Build(job, TaskPurpose::Run("cpu"));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->plan.data().tensor_file().path(), data_root_ + "/x.npy");
  EXPECT_EQ(task->plan.engine().compute_dtype(), v1::BFLOAT16);
  EXPECT_EQ(task->plan.batch_size(), 4);
}

// The path was canonical under the roots at admission; a link put in its place since then
// would lead the worker elsewhere (the sandbox would still confine it to the roots).
TEST_F(TaskBuilderTest, APathThatNoLongerResolvesToWhatWasAdmittedFailsTheRun) {
  const v1::Job job = Created(TensorFileSpec("x.npy"));
  testing::WriteBytes(data_root_ + "/y.npy", "another file");
  fs::remove(data_root_ + "/x.npy");
  fs::create_symlink(data_root_ + "/y.npy", data_root_ + "/x.npy");
  absl::Status status = Build(job, TaskPurpose::Run("cpu")).status();
  EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("submit it again"));
}

TEST_F(TaskBuilderTest, AMergeGetsTheShardsStatisticsInShardOrderOnTheCpuAndReadsNoData) {
  v1::JobSpec spec = TensorFileSpec("x.npy");
  spec.set_shards(2);
  const v1::Job parent = Created(spec);
  const std::vector<v1::Job> shards = SucceededShards(parent, {"statistics of shard 0", "statistics of shard 1"});
  absl::StatusOr<RecalibrationTask> task = Build(parent, TaskPurpose::Merge(shards));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->device, "cpu");
  EXPECT_THAT(task->merge_statistics, ElementsAre("shard-0.safetensors", "shard-1.safetensors"));
  EXPECT_EQ(ReadAll(scratch_ / "shard-0.safetensors"), "statistics of shard 0");
  EXPECT_EQ(ReadAll(scratch_ / "shard-1.safetensors"), "statistics of shard 1");
  EXPECT_EQ(task->plan.data().tensor_file().path(), data_root_ + "/x.npy");  // named in the report
  EXPECT_THAT(task->data_roots, IsEmpty());
  EXPECT_EQ(task->shard_count, 1);
}

TEST_F(TaskBuilderTest, DataOutsideTheRootsFailsARunAndAMergeAlike) {
  v1::JobSpec spec = TensorFileSpec("x.npy");
  spec.set_shards(2);
  const v1::Job parent = Created(spec);
  const std::vector<v1::Job> shards = SucceededShards(parent, {"a", "b"});
  roots_ = DataRoots();
  roots_.Add(tmp_.File("elsewhere"));
  for (const TaskPurpose& purpose : {TaskPurpose::Run("cpu"), TaskPurpose::Merge(shards)}) {
    const v1::Job& job = purpose.merged_shards ? parent : shards[0];
    absl::Status status = Build(job, purpose).status();
    EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
  }
}

TEST_F(TaskBuilderTest, AMissingModelIsNotFound) {
  v1::Job job;
  job.set_id("missing-model");
  job.set_tenant("t");
  *job.mutable_spec() = TensorFileSpec("x.npy");
  job.mutable_spec()->set_model_id("sha256:" + std::string(64, '0'));  // well formed, never uploaded
  job.mutable_spec()->set_batch_size(4);
  bool created = false;
  ASSERT_TRUE(jobs_->Create(job, *PlanJob(job.spec(), roots_.For("t")), &created).ok());
  EXPECT_TRUE(absl::IsNotFound(Build(job, TaskPurpose::Run("cpu")).status()));
}

}  // namespace
}  // namespace recal::jobs
