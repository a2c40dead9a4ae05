// ThreadPool: a fixed set of worker threads that run queued closures.
//
// For coarse tasks (loading shards, background copies, service work). The CPU
// kernels use OpenMP instead: its spinning barrier costs ~1 us per parallel
// region, where a condition-variable pool costs tens of microseconds, and a
// decode step runs ~100 such regions.
//
// Thread-safety: Schedule() and ParallelFor() may be called from any thread
// except a pool thread (ParallelFor from a pool thread could deadlock).
// The destructor waits for queued work to finish.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvmesh {

class ThreadPool {
 public:
  // `num_threads` <= 0 means one per hardware thread.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(threads_.size()); }

  // Queues `task`; it runs on some pool thread.
  void Schedule(std::function<void()> task);

  // Runs fn(begin, end) over [0, n) split into about num_threads() contiguous
  // ranges, and returns when all have finished. The calling thread takes one range.
  void ParallelFor(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  void WorkerLoop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace kvmesh
