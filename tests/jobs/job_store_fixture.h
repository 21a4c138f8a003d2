// A JobRepository over a real SQLite store in a fresh directory, with the EventHub it
// publishes to: the setup of the tests of the job state machine and of what reads and
// renews it (job_repository_test, watch_cursor_test, watch_reads_test, leases_test).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "server/jobs/event_hub.h"
#include "server/jobs/job_repository.h"
#include "server/store/metadata_store.h"
#include "tests/test_util.h"

namespace recal::jobs {

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metadata_ = *store::OpenMetadataStore(tmp_.File("recal.db"));
    jobs_ = std::make_unique<JobRepository>(metadata_.get(), &events_);
  }

  // A job of tenant "t" on model sha256:00, stored QUEUED without a plan: as stored.
  v1::Job Create(const std::string& id, const std::string& request_id = "") {
    v1::Job job;
    job.set_id(id);
    job.set_request_id(request_id);
    job.set_tenant("t");
    job.mutable_spec()->set_model_id("sha256:00");
    bool created = false;
    absl::StatusOr<v1::Job> stored = jobs_->Create(job, worker::v1::JobPlan(), &created);
    EXPECT_TRUE(stored.ok()) << stored.status();
    return stored.value_or(job);
  }
  // The same, then RUNNING on the CPU.
  void CreateRunning(const std::string& id) {
    Create(id);
    absl::StatusOr<v1::Job> started = jobs_->Start(id, "cpu");
    ASSERT_TRUE(started.ok()) << started.status();
  }
  // A running job's progress: `batches` done.
  void Progress(const std::string& id, int64_t batches) {
    v1::JobProgress progress;
    progress.set_batches_done(batches);
    absl::Status stored = jobs_->Progress(id, progress);
    ASSERT_TRUE(stored.ok()) << stored;
  }

  recal::testing::TempDir tmp_;
  EventHub events_;
  std::unique_ptr<store::MetadataStore> metadata_;
  std::unique_ptr<JobRepository> jobs_;
};

}  // namespace recal::jobs
