// A fixed set of threads that run posted tasks in order of posting: for work that may block
// (store reads) and must not run on a thread that cannot block (gRPC's callback threads).
// The threads are the bound; the queue holds what waits for them. Tasks must not throw.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace recal {

class TaskPool {
 public:
  explicit TaskPool(int threads);
  // Runs every task posted before, then joins the threads.
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  void Post(std::function<void()> task);
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Run();

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace recal
