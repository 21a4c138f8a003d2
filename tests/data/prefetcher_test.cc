#include "server/data/prefetcher.h"

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recal::data {
namespace {

using ::testing::HasSubstr;

// Yields batches holding 0, 1, 2, ... up to `count` (or forever), then `end`: nullopt,
// an error, or a thrown exception. Counts its calls and notes its destruction.
class FakeSource : public BatchSource {
 public:
  enum class End { kExhausted, kError, kThrow, kNever };
  struct Probe {
    std::atomic<int> calls{0};
    std::atomic<bool> destroyed{false};
  };

  FakeSource(int count, End end, Probe* probe, std::chrono::milliseconds delay = {})
      : count_(count), end_(end), probe_(probe), delay_(delay) {}
  ~FakeSource() override { probe_->destroyed = true; }

  absl::StatusOr<std::optional<Batch>> Next() override {
    const int k = probe_->calls++;
    std::this_thread::sleep_for(delay_);
    if (k < count_ || end_ == End::kNever) return std::optional<Batch>(Batch{at::full({1}, k)});
    switch (end_) {
      case End::kError: return absl::DataLossError("bad record");
      case End::kThrow: throw std::runtime_error("boom");
      default: return std::optional<Batch>();
    }
  }
  std::optional<int64_t> num_samples() const override { return count_; }
  std::string Describe() const override { return "fake"; }

 private:
  const int count_;
  const End end_;
  Probe* const probe_;
  const std::chrono::milliseconds delay_;
};

int ValueOf(const Batch& b) { return static_cast<int>(b[0].item<float>()); }

TEST(Prefetcher, KeepsOrderAndEndsLikeTheSource) {
  FakeSource::Probe probe;
  auto source = Prefetched(std::make_unique<FakeSource>(5, FakeSource::End::kExhausted, &probe), 2);
  EXPECT_EQ(source->num_samples(), 5);
  EXPECT_EQ(source->Describe(), "fake");
  for (int k = 0; k < 5; ++k) {
    absl::StatusOr<std::optional<Batch>> next = source->Next();
    ASSERT_TRUE(next.ok()) << next.status();
    ASSERT_TRUE(next->has_value());
    EXPECT_EQ(ValueOf(**next), k);
  }
  for (int again = 0; again < 2; ++again) {
    absl::StatusOr<std::optional<Batch>> next = source->Next();
    ASSERT_TRUE(next.ok());
    EXPECT_FALSE(next->has_value());
  }
  EXPECT_EQ(probe.calls, 6);  // nothing read past the end
}

TEST(Prefetcher, PassesErrorsThroughInOrderAndStopsThere) {
  FakeSource::Probe probe;
  auto source = Prefetched(std::make_unique<FakeSource>(2, FakeSource::End::kError, &probe), 4);
  EXPECT_EQ(ValueOf(**source->Next()), 0);
  EXPECT_EQ(ValueOf(**source->Next()), 1);
  for (int again = 0; again < 2; ++again) {
    absl::StatusOr<std::optional<Batch>> next = source->Next();
    EXPECT_EQ(next.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(next.status().message(), "bad record");
  }
  EXPECT_EQ(probe.calls, 3);
}

TEST(Prefetcher, TurnsExceptionsIntoInternalErrors) {
  FakeSource::Probe probe;
  auto source = Prefetched(std::make_unique<FakeSource>(1, FakeSource::End::kThrow, &probe), 1);
  EXPECT_EQ(ValueOf(**source->Next()), 0);
  absl::StatusOr<std::optional<Batch>> next = source->Next();
  EXPECT_EQ(next.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("boom"));
}

TEST(Prefetcher, ReadsAheadNoMoreThanDepth) {
  FakeSource::Probe probe;
  auto source = Prefetched(std::make_unique<FakeSource>(0, FakeSource::End::kNever, &probe), 3);
  for (int i = 0; i < 200 && probe.calls < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(probe.calls, 3);
  EXPECT_EQ(ValueOf(**source->Next()), 0);
  for (int i = 0; i < 200 && probe.calls < 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(probe.calls, 4);
}

TEST(Prefetcher, DestroyingEarlyStopsTheThreadAndFreesTheSource) {
  for (int read : {0, 1, 3}) {
    FakeSource::Probe probe;
    const auto start = std::chrono::steady_clock::now();
    {
      auto source = Prefetched(
          std::make_unique<FakeSource>(0, FakeSource::End::kNever, &probe, std::chrono::milliseconds(20)), 2);
      for (int i = 0; i < read; ++i) ASSERT_TRUE(source->Next().ok());
    }
    EXPECT_TRUE(probe.destroyed) << "read " << read;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << "read " << read;
  }
}

TEST(Prefetcher, DepthBelowOneMeansOne) {
  FakeSource::Probe probe;
  auto source = Prefetched(std::make_unique<FakeSource>(2, FakeSource::End::kExhausted, &probe), 0);
  EXPECT_EQ(ValueOf(**source->Next()), 0);
  EXPECT_EQ(ValueOf(**source->Next()), 1);
  EXPECT_FALSE((*source->Next()).has_value());
}

// Skips one file per batch, as an image folder with on_bad=skip might.
class SkippingSource : public BatchSource {
 public:
  absl::StatusOr<std::optional<Batch>> Next() override {
    if (calls_ == 5) return std::optional<Batch>();
    ++calls_;
    return std::optional<Batch>(Batch{at::full({1}, calls_.load())});
  }
  std::optional<int64_t> num_samples() const override { return 5; }
  std::string Describe() const override { return "skipping"; }
  int64_t skipped_files() const override { return calls_.load(); }

 private:
  std::atomic<int> calls_{0};
};

TEST(Prefetcher, SkippedFilesCountOnlyTheBatchesReturned) {
  auto source = Prefetched(std::make_unique<SkippingSource>(), 4);
  EXPECT_EQ(source->skipped_files(), 0);
  auto b = source->Next();
  ASSERT_TRUE(b.ok() && b->has_value());
  // Let the thread read ahead; the count must not follow it.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(source->skipped_files(), 1);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(source->Next().ok());
  EXPECT_EQ(source->skipped_files(), 5);
}

}  // namespace
}  // namespace recal::data
