// Sharded jobs through the real recal-server (one process, two workers): a job in K shards
// gives the unsharded job's statistics and the float64 reference's; a client-stream job fed
// by three concurrent pushers gives what one pusher over the union gives; a failing shard
// fails the job and stops the others; a cancel reaches every shard. That a shard whose
// worker dies is redone alone is in cluster_e2e_test.
#include <filesystem>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/data/batch_source.h"
#include "tests/engine/test_util.h"
#include "tests/server/calls.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

namespace recal::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const std::string kFixtures = RECAL_FIXTURES_DIR;
const std::string kModel = kFixtures + "/models/resnet18.traced_eval.pt";

class ShardedJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(tmp_.File("root"));
    server_ = std::make_unique<ServerProcess>(
        tmp_.File("data"), std::vector<std::string>{"--data_root=" + kFixtures + "," + tmp_.File("root"),
                                                    "--cpu_workers=2", "--threads_per_worker=1"});
    ASSERT_TRUE(server_->ok()) << server_->log();
    stub_ = server_->Stub();
    ASSERT_TRUE(Upload(*stub_, ReadBytes(kModel), &model_).ok());
  }
  v1::Job Submit(v1::SubmitJobRequest request, int shards, grpc::Status* status = nullptr) {
    request.mutable_spec()->set_shards(shards);
    grpc::ClientContext context;
    v1::Job job;
    grpc::Status s = stub_->SubmitJob(&context, request, &job);
    if (status != nullptr) {
      *status = s;
    } else {
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    return job;
  }
  v1::Job Get(const std::string& id) { return GetJob(*stub_, id); }
  std::map<std::string, at::Tensor> Buffers(const std::string& id) {
    const std::string path = tmp_.File(id + ".safetensors");
    std::ofstream(path, std::ios::binary) << Download(*stub_, id, v1::BN_BUFFERS);
    return engine::testing::ReadSafetensors(path);
  }
  v1::SubmitJobRequest StreamJob(int batch_size) {
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_model_id(model_.id());
    request.mutable_spec()->set_batch_size(batch_size);
    request.mutable_spec()->mutable_data()->mutable_client_stream();
    return request;
  }
  // Pushes `batches` [from, to) to shard `shard` of `id`, then `last`.
  grpc::Status Push(const std::string& id, int shard, const std::vector<data::Batch>& batches, size_t from,
                    size_t to) {
    std::vector<v1::Tensor> tensors;
    for (size_t i = from; i < to; ++i) tensors.push_back(engine::testing::ToProto(batches[i][0]));
    return PushAll(*stub_, id, shard, tensors);
  }

  TempDir tmp_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Recal::Stub> stub_;
  v1::Model model_;
};

TEST_F(ShardedJobsTest, AJobInKShardsEqualsTheUnshardedJobAndTheReference) {
  // 20 samples in batches of 8: 3 batches, the last of 4.
  const v1::Job whole = Submit(NpyJob(model_.id(), "data/resnet18.npy", 8), 0);
  std::vector<v1::Job> sharded;
  for (int k : {2, 3}) sharded.push_back(Submit(NpyJob(model_.id(), "data/resnet18.npy", 8), k));
  ASSERT_EQ(WaitForState(*stub_, whole.id(), v1::SUCCEEDED).state(), v1::SUCCEEDED);
  const auto unsharded = Buffers(whole.id());
  const auto reference = engine::testing::ReadSafetensors(kFixtures + "/ref/resnet18.population.safetensors");
  for (const v1::Job& job : sharded) {
    const int k = job.spec().shards();
    std::vector<v1::JobEvent> events = Watch(*stub_, job.id());
    ASSERT_FALSE(events.empty());
    ASSERT_EQ(events.back().state(), v1::SUCCEEDED) << k << " shards: " << Get(job.id()).error().message();
    std::vector<v1::JobState> states;
    const v1::RunReport* summary = nullptr;
    for (const v1::JobEvent& event : events) {
      if (event.kind_case() == v1::JobEvent::kState) states.push_back(event.state());
      if (event.has_summary()) summary = &event.summary();
    }
    EXPECT_THAT(states, ::testing::ElementsAre(v1::QUEUED, v1::RUNNING, v1::SUCCEEDED));
    ASSERT_NE(summary, nullptr);
    EXPECT_EQ(summary->shards(), k);
    EXPECT_EQ(summary->batches(), 3);
    EXPECT_EQ(summary->samples(), 20);
    EXPECT_EQ(summary->layers_recalibrated(), 20);
    const v1::Job done = Get(job.id());
    EXPECT_EQ(done.progress().batches_done(), 3) << "the shards' progress, summed";
    EXPECT_EQ(done.progress().samples_done(), 20);

    const auto got = Buffers(job.id());
    EXPECT_LE(engine::testing::WorstRelativeError(got, reference), 1e-5) << k << " shards";
    // float32 buffers of float64 statistics merged in another order: at most an ulp apart.
    EXPECT_LE(engine::testing::WorstRelativeError(got, unsharded), 1e-6) << k << " shards";

    // The shards: visible by id, each with its statistics; not listed.
    for (int i = 0; i < k; ++i) {
      const v1::Job shard = Get(job.id() + "-s" + std::to_string(i));
      EXPECT_EQ(shard.parent_id(), job.id());
      EXPECT_EQ(shard.shard(), i);
      EXPECT_EQ(shard.state(), v1::SUCCEEDED);
      EXPECT_EQ(shard.attempts(), 1);
      EXPECT_FALSE(Download(*stub_, shard.id(), v1::SHARD_STATISTICS).empty());
    }
  }
  grpc::ClientContext context;
  v1::ListJobsResponse list;
  ASSERT_TRUE(stub_->ListJobs(&context, v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 3);
  for (const v1::Job& job : list.jobs()) EXPECT_TRUE(job.parent_id().empty()) << job.id();
}

TEST_F(ShardedJobsTest, AStreamFedByThreeConcurrentPushersEqualsOnePusherOverTheUnion) {
  auto source = data::OpenBatchSource("npy:" + kFixtures + "/data/resnet18.npy", 4);
  ASSERT_TRUE(source.ok());
  std::vector<data::Batch> batches;  // 5 of 4 samples
  while (true) {
    auto batch = (*source)->Next();
    ASSERT_TRUE(batch.ok());
    if (!*batch) break;
    batches.push_back(**batch);
  }
  ASSERT_EQ(batches.size(), 5u);
  const v1::Job one = Submit(StreamJob(4), 0);
  ASSERT_TRUE(Push(one.id(), 0, batches, 0, 5).ok());
  const v1::Job three = Submit(StreamJob(4), 3);
  // Each pusher its own share, all at once, the shares of different sizes.
  const std::vector<std::pair<size_t, size_t>> shares = {{0, 2}, {2, 4}, {4, 5}};
  std::vector<grpc::Status> results(3);
  std::vector<std::thread> pushers;
  for (int k = 0; k < 3; ++k) {
    pushers.emplace_back([&, k] { results[k] = Push(three.id(), k, batches, shares[k].first, shares[k].second); });
  }
  for (std::thread& pusher : pushers) pusher.join();
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(results[k].ok()) << k << ": " << results[k].error_message();

  ASSERT_EQ(WaitForState(*stub_, one.id(), v1::SUCCEEDED).state(), v1::SUCCEEDED);
  const v1::Job done = WaitForState(*stub_, three.id(), v1::SUCCEEDED);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.error().message();
  EXPECT_LE(engine::testing::WorstRelativeError(Buffers(three.id()), Buffers(one.id())), 1e-6);
  EXPECT_EQ(done.progress().batches_done(), 5);

  // No shard 3; a shard that has ended takes nothing more; an unsharded job has only shard 0.
  EXPECT_EQ(Push(three.id(), 3, batches, 0, 1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Push(three.id(), 1, batches, 0, 1).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  const v1::Job unsharded = Submit(StreamJob(4), 0);
  const grpc::Status refused = Push(unsharded.id(), 1, batches, 0, 1);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("no shard 1"));
}

TEST_F(ShardedJobsTest, AFailingShardFailsTheJobNamingIt) {
  // 5 batches of 8; the last (shard 1 of 2: batches 2..4) holds a NaN.
  at::Tensor x = at::randn({40, 3, 64, 64});
  x[37][1][5][5] = std::numeric_limits<float>::quiet_NaN();
  const std::string values(static_cast<const char*>(x.data_ptr()), x.numel() * sizeof(float));
  WriteBytes(tmp_.File("root/nan.npy"),
             NpyFile("{'descr': '<f4', 'fortran_order': False, 'shape': (40, 3, 64, 64), }", values));
  const v1::Job job = Submit(NpyJob(model_.id(), tmp_.File("root/nan.npy"), 8), 2);
  const v1::Job failed = WaitForState(*stub_, job.id(), v1::FAILED);
  ASSERT_EQ(failed.state(), v1::FAILED);
  EXPECT_EQ(failed.error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(failed.error().message(), HasSubstr("shard 1"));
  EXPECT_THAT(failed.error().message(), HasSubstr("NaN"));
  EXPECT_EQ(Get(job.id() + "-s1").state(), v1::FAILED);
  // More shards than batches: refused by every shard, before any forward pass.
  const v1::Job too_many = Submit(NpyJob(model_.id(), "data/resnet18.npy", 8), 4);
  const v1::Job refused = WaitForState(*stub_, too_many.id(), v1::FAILED);
  EXPECT_THAT(refused.error().message(), HasSubstr("fewer than its 4 shards"));
  // Shards out of range are the request's fault.
  grpc::Status status;
  Submit(NpyJob(model_.id(), "data/resnet18.npy", 8), 65, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  Submit(NpyJob(model_.id(), "data/resnet18.npy", 8), -1, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ShardedJobsTest, CancellingAShardedJobCancelsEveryShard) {
  const v1::Job job = Submit(LongJob(model_.id()), 2);
  WaitForState(*stub_, job.id() + "-s0", v1::RUNNING);
  grpc::ClientContext context;
  v1::CancelJobRequest request;
  request.set_id(job.id());
  v1::Job cancelled;
  ASSERT_TRUE(stub_->CancelJob(&context, request, &cancelled).ok());
  EXPECT_EQ(WaitForState(*stub_, job.id(), v1::CANCELLED, 60).state(), v1::CANCELLED);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(WaitForState(*stub_, job.id() + "-s" + std::to_string(k), v1::CANCELLED, 60).state(), v1::CANCELLED);
  }
}

}  // namespace
}  // namespace recal::testing
