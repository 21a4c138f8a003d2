// RunTask, in this process (no sandbox, no pipes): a recalibration runs its JobPlan as it is.
// The data is opened from the plan's typed source, so no data spec is parsed from text between
// the server's admission and the batch source; the plan's enums reach the engine.
#include "server/worker/worker_task.h"

#include <filesystem>
#include <vector>

#include <gtest/gtest.h>

#include "common/data_spec.h"
#include "tests/test_util.h"

namespace recal::worker {
namespace {

namespace fs = std::filesystem;
const std::string kFixtures = RECAL_FIXTURES_DIR;

// The events of `task`, run on the fixture model over its npy data in `scratch`.
std::vector<v1::Event> EventsOf(const v1::Task& task, const std::string& scratch) {
  std::vector<v1::Event> events;
  TaskContext context{kFixtures + "/models/bn1d_2d.traced_train.pt", scratch, nullptr};
  const absl::Status sent = RunTask(task, context, [&](const v1::Event& event) {
    events.push_back(event);
    return absl::OkStatus();
  });
  EXPECT_TRUE(sent.ok()) << sent;
  return events;
}

v1::Task NpyTask() {
  v1::Task task;
  v1::Recalibrate* job = task.mutable_recalibrate();
  job->set_device("cpu");
  job->set_threads(1);
  job->add_data_roots(kFixtures);
  v1::JobPlan* plan = job->mutable_plan();
  plan->set_model_id("sha256:the-plans-model");
  plan->set_batch_size(8);
  plan->mutable_data()->mutable_tensor_file()->set_format(recal::v1::TensorFileSource::NPY);
  plan->mutable_data()->mutable_tensor_file()->set_path(kFixtures + "/data/bn1d_2d.npy");
  return task;
}

TEST(WorkerTask, APlansDataIsOpenedTypedWithoutParsingASpec) {
  testing::TempDir tmp;
  v1::Task task = NpyTask();
  task.mutable_recalibrate()->mutable_plan()->mutable_engine()->set_compute_dtype(recal::v1::BFLOAT16);
  const int64_t parsed_before = data::ParseDataSpecCount();
  const std::vector<v1::Event> events = EventsOf(task, tmp.path());
  EXPECT_EQ(data::ParseDataSpecCount() - parsed_before, 0);
  ASSERT_FALSE(events.empty());
  ASSERT_TRUE(events.back().has_report()) << events.back().ShortDebugString();
  const recal::v1::RunReport& report = events.back().report();
  EXPECT_EQ(report.model(), "sha256:the-plans-model");
  EXPECT_EQ(report.data(), "npy:" + kFixtures + "/data/bn1d_2d.npy");
  EXPECT_EQ(report.batch_size(), 8);
  EXPECT_EQ(report.batches(), 4);  // 26 samples
  EXPECT_EQ(report.compute_dtype(), "bfloat16");
  EXPECT_TRUE(fs::exists(fs::path(tmp.path()) / "model.pt"));
}

TEST(WorkerTask, APlanWithoutDataFailsSayingSo) {
  testing::TempDir tmp;
  v1::Task task = NpyTask();
  task.mutable_recalibrate()->mutable_plan()->clear_data();
  const std::vector<v1::Event> events = EventsOf(task, tmp.path());
  ASSERT_FALSE(events.empty());
  ASSERT_TRUE(events.back().has_failure());
  EXPECT_NE(events.back().failure().message().find("names no data source"), std::string::npos)
      << events.back().failure().message();
}

}  // namespace
}  // namespace recal::worker
