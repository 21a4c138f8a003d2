// Batches a client pushes (PushBatches) for a job whose data source is client_stream: a
// bounded queue between the RPC (which blocks while it is full: back-pressure) and the
// job's runner, which relays them to the worker (which converts and normalises them).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "recal/v1/recal.pb.h"
#include "recal/worker/v1/worker.pb.h"

namespace recal::jobs {

// The bytes of data a pushed tensor's dtype and shape call for; an error for a dtype the API
// does not carry, a shape without a batch dim or with a non-positive dim, or over
// max_batch_bytes.
absl::StatusOr<int64_t> PushedTensorBytes(const v1::Tensor& tensor, int64_t max_batch_bytes);

class StreamFeed {
 public:
  StreamFeed(v1::ClientStreamSource normalisation, int64_t max_batch_bytes, int capacity = 4);

  // Checks and queues one batch (blocks while `capacity` batches wait). `last` ends the
  // data. Fails once the feed is closed or ended, or for a malformed batch: a dtype other
  // than float32/float16/uint8, a shape without a batch dim or with a non-positive dim, data
  // that does not match the shape, over max_batch_bytes (all inputs together), inputs not sharing dim 0, or
  // mean/std that do not match the channels (dim 1).
  // `inputs` are taken (moved into the queue, no copy) once they pass the checks.
  absl::Status Push(google::protobuf::RepeatedPtrField<v1::Tensor>& inputs, bool last);
  // Wakes both sides: Next() returns `reason` (cancellation, shutdown), Push() fails.
  void Close(const absl::Status& reason);

  // Next() waits no later than `deadline` for the client, nor longer than `idle` after the
  // last batch pushed (or after this call, before any): DEADLINE_EXCEEDED after either, so
  // that a client that stops pushing gives the worker back. `idle_flag` names the setting in
  // the message.
  void set_deadline(std::chrono::steady_clock::time_point deadline, std::chrono::steady_clock::duration idle,
                    const std::string& idle_flag);

  // The next batch, or std::nullopt after the one marked last.
  absl::StatusOr<std::optional<worker::v1::PushedBatch>> Next();

 private:
  absl::Status Check(const v1::Tensor& tensor) const;

  const v1::ClientStreamSource normalisation_;
  const int64_t max_batch_bytes_;
  const int capacity_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<worker::v1::PushedBatch> batches_;
  bool ended_ = false;          // the client sent the batch marked last
  bool delivered_last_ = false;  // and Next() has handed it out
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::duration idle_ = std::chrono::steady_clock::duration::max();
  std::string idle_flag_;
  std::chrono::steady_clock::time_point last_push_ = std::chrono::steady_clock::now();
  absl::Status closed_;
};

// The feeds of the client_stream jobs that have not ended, by job id. A feed is opened when
// its job is queued and closed when the job ends, so that a push never makes a feed nobody
// reads. Thread-safe.
class StreamFeeds {
 public:
  explicit StreamFeeds(int64_t max_batch_bytes) : max_batch_bytes_(max_batch_bytes) {}

  // The job's feed, made if it has none.
  std::shared_ptr<StreamFeed> Open(const v1::Job& job);
  // nullptr once closed (or never opened).
  std::shared_ptr<StreamFeed> Find(const std::string& job_id) const;
  // The job's feed once it is opened, waiting up to `timeout` for that (a relayed stream
  // may reach a worker process just before its claim of the job has opened the feed).
  std::shared_ptr<StreamFeed> Await(const std::string& job_id, std::chrono::milliseconds timeout) const;
  // Ends the feed (both sides see `reason`) and forgets it.
  void Close(const std::string& job_id, const absl::Status& reason);
  void CloseAll(const absl::Status& reason);

 private:
  const int64_t max_batch_bytes_;
  mutable std::mutex mu_;
  mutable std::condition_variable opened_;
  std::map<std::string, std::shared_ptr<StreamFeed>> feeds_;
};

}  // namespace recal::jobs
