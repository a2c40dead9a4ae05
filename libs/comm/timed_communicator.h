// TimedCommunicator: a Communicator that forwards to another and adds up the wall time
// spent inside its collectives, so that a step's communication share can be reported.
// The time includes waiting for the slowest peer to arrive, not only the transfer. For a
// communicator that only queues its collectives (Communicator::queue()) it is the time
// to queue them: their run time is the device's, inside AwaitQueue (not counted).
//
// Thread-safety: as the wrapped communicator (one rank thread); total_seconds() may be
// read from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>

#include "comm/communicator.h"

namespace kvmesh::comm {

class TimedCommunicator : public Communicator {
 public:
  explicit TimedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string_view backend_name() const override { return inner_->backend_name(); }
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override {
    return Timed([&] { return inner_->AllReduceSum(data, count, dtype); });
  }
  absl::Status AllGather(const void* send, void* recv, int64_t count, DType dtype) override {
    return Timed([&] { return inner_->AllGather(send, recv, count, dtype); });
  }
  absl::Status Broadcast(void* data, int64_t count, DType dtype, int root) override {
    return Timed([&] { return inner_->Broadcast(data, count, dtype, root); });
  }
  absl::Status Barrier() override {
    return Timed([&] { return inner_->Barrier(); });
  }
  void* queue() const override { return inner_->queue(); }
  absl::Status AwaitQueue(void* event) override { return inner_->AwaitQueue(event); }

  // Seconds spent in collectives since construction, and how many ran.
  double total_seconds() const { return static_cast<double>(total_ns_.load(std::memory_order_relaxed)) * 1e-9; }
  int64_t num_calls() const { return num_calls_.load(std::memory_order_relaxed); }

 private:
  template <typename Fn>
  absl::Status Timed(Fn&& fn) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = fn();
    total_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
                            .count(),
                        std::memory_order_relaxed);
    num_calls_.fetch_add(1, std::memory_order_relaxed);
    return status;
  }

  std::unique_ptr<Communicator> inner_;
  std::atomic<int64_t> total_ns_{0};
  std::atomic<int64_t> num_calls_{0};
};

}  // namespace kvmesh::comm
