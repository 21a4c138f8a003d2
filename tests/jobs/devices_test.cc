// --devices resolved without LibTorch (server/jobs/devices.h), over a counter that stands in
// for recal-worker --print_cuda_devices (the real one: worker_runner_test.cc).
#include "server/jobs/devices.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace recal::jobs {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// `cuda_devices` CUDA devices, counting how often it is asked.
struct Counter {
  int cuda_devices = 0;
  int asked = 0;
  CudaDeviceCounter Fn() {
    return [this]() -> absl::StatusOr<int> {
      ++asked;
      return cuda_devices;
    };
  }
};

TEST(ResolveDevices, CpuNeverAsksForCudaDevices) {
  Counter counter{2};
  EXPECT_THAT(*ResolveDevices("cpu", 3, counter.Fn()), ElementsAre("cpu", "cpu", "cpu"));
  EXPECT_THAT(*ResolveDevices("cpu", 0, counter.Fn()), ElementsAre("cpu"));
  EXPECT_THAT(*ResolveDevices("cpu,cpu:1", 3, counter.Fn()), ElementsAre("cpu", "cpu:1"));
  EXPECT_EQ(counter.asked, 0);
}

TEST(ResolveDevices, AutoIsEveryCudaDeviceOrCpuWorkers) {
  Counter two{2};
  EXPECT_THAT(*ResolveDevices("auto", 3, two.Fn()), ElementsAre("cuda:0", "cuda:1"));
  EXPECT_EQ(two.asked, 1);
  Counter none{0};
  EXPECT_THAT(*ResolveDevices("auto", 2, none.Fn()), ElementsAre("cpu", "cpu"));
}

TEST(ResolveDevices, NamedCudaDevicesMustExist) {
  Counter two{2};
  EXPECT_THAT(*ResolveDevices("cuda:1,cuda:0,cpu,cuda", 1, two.Fn()), ElementsAre("cuda:1", "cuda:0", "cpu", "cuda"));
  EXPECT_EQ(two.asked, 1) << "asked once for the whole list";
  auto beyond = ResolveDevices("cuda:0,cuda:2", 1, two.Fn());
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(beyond.status().message(), "device cuda:2 requested, but recal-worker's LibTorch sees 2 CUDA device(s)");
  Counter none{0};
  for (const char* spec : {"cuda:0", "cuda"}) {
    auto refused = ResolveDevices(spec, 1, none.Fn());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << spec;
    EXPECT_THAT(refused.status().message(), HasSubstr("sees 0 CUDA device(s)")) << spec;
  }
}

TEST(ResolveDevices, BadNamesAreRefusedBeforeCounting) {
  Counter two{2};
  for (const char* spec : {"gpu", "cuda:01", "cuda:-1", "cuda:+1", "cuda:", "CUDA:0", " cuda:0", "cuda:0 ", "cuda0",
                           "mps", "cuda:0,tpu", "cuda:99999999999", "cpux"}) {
    auto refused = ResolveDevices(spec, 1, two.Fn());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << spec << ": " << refused.status();
    EXPECT_THAT(refused.status().message(), HasSubstr("': use cpu, auto or cuda:N")) << spec;
  }
  EXPECT_EQ(two.asked, 0);
  for (const char* spec : {"", ",", ",,"}) {
    EXPECT_EQ(ResolveDevices(spec, 1, two.Fn()).status().message(), "--devices names no device") << spec;
  }
}

TEST(ResolveDevices, ACounterThatFailsSaysWhatAskedKeepingItsCode) {
  const CudaDeviceCounter broken = []() -> absl::StatusOr<int> {
    return absl::DeadlineExceededError("recal-worker --print_cuda_devices did not answer within 1m");
  };
  for (const char* spec : {"auto", "cuda:0"}) {
    auto failed = ResolveDevices(spec, 1, broken);
    EXPECT_EQ(failed.status().code(), absl::StatusCode::kDeadlineExceeded) << spec;
    EXPECT_EQ(failed.status().message(),
              std::string("--devices=") + spec +
                  ": cannot count the CUDA devices: recal-worker --print_cuda_devices did not answer within 1m");
  }
  EXPECT_TRUE(ResolveDevices("cpu", 1, broken).ok());
}

}  // namespace
}  // namespace recal::jobs
