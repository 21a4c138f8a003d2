#include "server/data/prefetcher.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace recal::data {
namespace {

using Result = absl::StatusOr<std::optional<Batch>>;

// A result and the inner source's skipped_files() right after it was read.
struct Entry {
  Result result;
  int64_t skipped_files = 0;
};

bool IsLast(const Result& r) { return !r.ok() || !r->has_value(); }

class Prefetcher final : public BatchSource {
 public:
  Prefetcher(std::unique_ptr<BatchSource> inner, int depth, bool pin_memory)
      : inner_(std::move(inner)),
        depth_(static_cast<size_t>(std::max(depth, 1))),
        pin_memory_(pin_memory),
        num_samples_(inner_->num_samples()),
        description_(inner_->Describe()) {
    // Without a thread (the process is out of them) reading inline is still correct.
    try {
      thread_ = std::thread([this] { Run(); });
    } catch (const std::exception&) {
    }
  }

  ~Prefetcher() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    space_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  Result Next() override {
    if (!thread_.joinable()) return NextInline();
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [this] { return !queue_.empty() || final_.has_value(); });
    if (queue_.empty()) return *final_;
    Entry e = std::move(queue_.front());
    queue_.pop_front();
    skipped_files_.store(e.skipped_files);
    lock.unlock();
    space_.notify_one();
    return std::move(e.result);
  }

  std::optional<int64_t> num_samples() const override { return num_samples_; }
  std::string Describe() const override { return description_; }
  int64_t skipped_files() const override { return skipped_files_.load(); }

 private:
  void Run() {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        space_.wait(lock, [this] { return stopping_ || queue_.size() < depth_; });
        if (stopping_) return;
      }
      Result r = ReadOne();
      const bool last = IsLast(r);
      const int64_t skipped = inner_->skipped_files();
      {
        std::lock_guard<std::mutex> lock(mu_);
        // The terminal result is queued once (to keep its place after earlier batches)
        // and remembered, so every later Next() sees it again.
        if (last) final_ = r;
        queue_.push_back({std::move(r), skipped});
      }
      ready_.notify_one();
      if (last) return;
    }
  }

  Result NextInline() {
    if (final_) return *final_;
    Result r = ReadOne();
    if (IsLast(r)) final_ = r;
    skipped_files_.store(inner_->skipped_files());
    return r;
  }

  Result ReadOne() {
    try {
      Result r = inner_->Next();
      if (pin_memory_ && r.ok() && r->has_value()) {
        for (at::Tensor& t : **r) t = t.pin_memory();
      }
      return r;
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(description_, ": reading ahead threw: ", e.what()));
    } catch (...) {
      return absl::InternalError(absl::StrCat(description_, ": reading ahead threw a non-standard exception"));
    }
  }

  const std::unique_ptr<BatchSource> inner_;
  const size_t depth_;
  const bool pin_memory_;
  const std::optional<int64_t> num_samples_;
  const std::string description_;

  std::mutex mu_;
  std::condition_variable ready_;  // queue_ gained an item
  std::condition_variable space_;  // queue_ lost an item, or stopping_
  std::deque<Entry> queue_;
  std::optional<Result> final_;
  std::atomic<int64_t> skipped_files_{0};
  bool stopping_ = false;

  std::thread thread_;  // not joinable if it could not be started
};

}  // namespace

std::unique_ptr<BatchSource> Prefetched(std::unique_ptr<BatchSource> inner, int depth, bool pin_memory) {
  return std::make_unique<Prefetcher>(std::move(inner), depth, pin_memory);
}

}  // namespace recal::data
