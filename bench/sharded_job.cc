// One job in K = 1 and K = 2 shards through a real recal-server with two workers of one
// intra-op thread each, interleaved (K=1, K=2, K=1, ...): the wall time from SubmitJob to
// SUCCEEDED, the speed-up, and the merge's cost (from the last shard's end to the job's end:
// the coordinator noticing, the sandboxed merge task loading the model, merging and saving).
// Prints one table of medians.
//
//   build/bin/sharded_job_bench [--rounds 3] [--batches 24] [--batch_size 16] [--size 112]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "bench/median.h"
#include "common/command_line.h"
#include "tests/server/calls.h"
#include "tests/server/server_process.h"
#include "tests/test_util.h"

ABSL_FLAG(int, rounds, 3, "jobs per K");
ABSL_FLAG(int, batches, 24, "batches per job");
ABSL_FLAG(int, batch_size, 16, "samples per batch");
ABSL_FLAG(int, size, 112, "image side of the synthetic 3xSxS samples");
ABSL_FLAG(std::string, model, "build/fixtures/models/resnet18.traced_eval.pt", "the model");

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(const google::protobuf::Timestamp& t) { return t.seconds() + t.nanos() / 1e9; }

recal::v1::Job Get(recal::v1::Recal::Stub& stub, const std::string& id) {
  grpc::ClientContext context;
  recal::v1::GetJobRequest request;
  request.set_id(id);
  recal::v1::Job job;
  stub.GetJob(&context, request, &job).IgnoreError();
  return job;
}

}  // namespace

int main(int argc, char** argv) {
  recal::ParseCommandLineOrExit(argc, argv, "sharded_job_bench", "sharded_job_bench: one job in 1 and 2 shards on two one-thread workers: the speed-up and the merge");
  recal::testing::TempDir tmp;
  recal::testing::ServerProcess server(tmp.File("data"), {"--cpu_workers=2", "--threads_per_worker=1"});
  if (!server.ok()) {
    std::fprintf(stderr, "recal-server did not start:\n%s\n", server.log().c_str());
    return 1;
  }
  auto stub = server.Stub();
  recal::v1::Model model;
  if (!recal::testing::Upload(*stub, recal::testing::ReadBytes(absl::GetFlag(FLAGS_model)), &model).ok()) {
    std::fprintf(stderr, "cannot upload %s\n", absl::GetFlag(FLAGS_model).c_str());
    return 1;
  }
  const int size = absl::GetFlag(FLAGS_size);
  std::vector<double> wall[3], merge;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (int shards : {1, 2}) {
      recal::v1::SubmitJobRequest request;
      recal::v1::JobSpec* spec = request.mutable_spec();
      spec->set_model_id(model.id());
      spec->set_batch_size(absl::GetFlag(FLAGS_batch_size));
      spec->mutable_data()->mutable_synthetic()->add_sample_shape(3);
      spec->mutable_data()->mutable_synthetic()->add_sample_shape(size);
      spec->mutable_data()->mutable_synthetic()->add_sample_shape(size);
      spec->mutable_options()->set_max_batches(absl::GetFlag(FLAGS_batches));
      spec->set_shards(shards > 1 ? shards : 0);
      const auto start = Clock::now();
      grpc::ClientContext context;
      recal::v1::Job job;
      if (!stub->SubmitJob(&context, request, &job).ok()) return 1;
      const recal::v1::Job done = recal::testing::WaitForState(*stub, job.id(), recal::v1::SUCCEEDED, 600);
      if (done.state() != recal::v1::SUCCEEDED) {
        std::fprintf(stderr, "job %s: %s\n", job.id().c_str(), done.error().message().c_str());
        return 1;
      }
      wall[shards].push_back(std::chrono::duration<double>(Clock::now() - start).count());
      if (shards > 1) {
        double last_shard_end = 0;
        for (int k = 0; k < shards; ++k) {
          last_shard_end = std::max(last_shard_end, Seconds(Get(*stub, job.id() + "-s" + std::to_string(k)).end_time()));
        }
        merge.push_back(Seconds(done.end_time()) - last_shard_end);
        std::fprintf(stderr, "merge %.3f s (job end %.3f, last shard end %.3f)\n", merge.back(),
                     Seconds(done.end_time()), last_shard_end);
      }
    }
  }
  const double one = recal::bench::Median(wall[1]), two = recal::bench::Median(wall[2]);
  std::printf("sharded job: resnet18, %d batches of %dx3x%dx%d, 2 workers x 1 thread, median of %d\n",
              absl::GetFlag(FLAGS_batches), absl::GetFlag(FLAGS_batch_size), size, size,
              absl::GetFlag(FLAGS_rounds));
  std::printf("  %-34s %10s\n", "", "value");
  std::printf("  %-34s %9.2fs\n", "K=1 wall (submit -> SUCCEEDED)", one);
  std::printf("  %-34s %9.2fs\n", "K=2 wall (submit -> SUCCEEDED)", two);
  std::printf("  %-34s %10.2f\n", "speed-up K=1 / K=2", one / two);
  std::printf("  %-34s %8.0fms\n", "merge (last shard end -> job end)", 1000 * recal::bench::Median(merge));
  return 0;
}
