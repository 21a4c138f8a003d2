// One scratch directory per attempt at a job, on the blob store workers share: a run that lost
// its lease and ends late removes only its own files, never those of the attempt that took
// the job over; the next attempt clears what a killed process's attempt left.
#include "server/jobs/scratch.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "server/store/local_blob_store.h"
#include "tests/test_util.h"

namespace recal::jobs {
namespace {

namespace fs = std::filesystem;

v1::Job Attempt(const std::string& id, int attempt) {
  v1::Job job;
  job.set_id(id);
  job.set_attempts(attempt);
  return job;
}

class ScratchTest : public ::testing::Test {
 protected:
  void SetUp() override { blobs_ = *store::LocalBlobStore::Open(tmp_.File("blobs")); }
  testing::TempDir tmp_;
  std::unique_ptr<store::LocalBlobStore> blobs_;
};

TEST_F(ScratchTest, ALateEndOfAnAbandonedAttemptLeavesTheNextAttemptsFilesAlone) {
  auto abandoned = Scratch::Make(*blobs_, Attempt("job-1", 1));
  ASSERT_TRUE(abandoned.ok()) << abandoned.status();
  auto next = Scratch::Make(*blobs_, Attempt("job-1", 2));
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_NE((*abandoned)->path(), (*next)->path());
  const fs::path result = (*next)->path() / "model.pt";
  std::ofstream(result) << "the second attempt's result";
  abandoned->reset();  // the first attempt's run ends, late
  EXPECT_TRUE(fs::exists(result));
}

TEST_F(ScratchTest, AnAttemptClearsWhatEarlierAttemptsOfItsJobLeftAndNoOtherJobs) {
  fs::path killed_process_dir, other_job_dir;
  {
    auto killed = Scratch::Make(*blobs_, Attempt("job-1", 1));
    ASSERT_TRUE(killed.ok());
    killed_process_dir = (*killed)->path();
    auto other = Scratch::Make(*blobs_, Attempt("job-2", 1));
    ASSERT_TRUE(other.ok());
    other_job_dir = (*other)->path();
    // A killed process never removes its directory: copy them aside as it would leave them.
    fs::copy(killed_process_dir, killed_process_dir.string() + ".kept");
    fs::copy(other_job_dir, other_job_dir.string() + ".kept");
  }
  fs::rename(killed_process_dir.string() + ".kept", killed_process_dir);
  fs::rename(other_job_dir.string() + ".kept", other_job_dir);
  std::ofstream(killed_process_dir / "model.pt") << "half written";

  auto third = Scratch::Make(*blobs_, Attempt("job-1", 3));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE(fs::exists(killed_process_dir));
  EXPECT_TRUE(fs::exists(other_job_dir));
  EXPECT_TRUE(fs::is_empty((*third)->path()));
  const fs::path third_dir = (*third)->path();
  third->reset();
  EXPECT_FALSE(fs::exists(third_dir));
}

}  // namespace
}  // namespace recal::jobs
