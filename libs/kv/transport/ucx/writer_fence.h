// The receiver's fence against late cross-memory-attach writers (cma_put.h). A write by
// process_vm_writev cannot be refused by the process written into: a sender stopped
// (SIGSTOP, a long deschedule) between its last check and its write resumes and writes
// whenever it runs again. So a lease that ends while such a sender may still write does
// not hand its blocks back with its on_done: it is fenced here, and its on_released
// runs only once the writer is known to write no more:
//   1. it acknowledged it: its Done (sent once none of its writes is running) or its
//      Fenced (sent once its push ended and none of its writes is running; a write loop
//      checks the push before each write, so none starts after);
//   2. its process is gone: a pidfd opened at its Hello (while it was surely alive, so a
//      reused pid cannot pass for it) polls readable; where the kernel has no
//      pidfd_open, kill(pid, 0) answering ESRCH (a reused pid then only keeps the fence
//      longer).
// Never otherwise: the fence has no timeout. A stopped process does not run, so it can
// acknowledge nothing, and its late write lands whenever it resumes; its lease's blocks
// stay out of use for as long as it lives (the engine counts them as quarantined, and
// as stranded once that lasted a lease timeout: kv/kv_handoff_ledger.h). A writer whose
// pid is unknown (0) is released only by its acknowledgement.
//
// Which lease's writer this is: the (lease token, push id) pair every message carries,
// both unique (a token is never reused; a push id names one OpenPush), so a stale
// writer's acknowledgement or completion never releases or completes another lease.
//
// Thread-safety: not thread-safe; owned by the transport's thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace kvmesh::kv {

// A sender process as its receiver watches it. Move-only: owns its pidfd.
class WriterProcess {
 public:
  // Watches `pid` (<= 0: unknown, never seen gone).
  static WriterProcess Open(pid_t pid);
  WriterProcess(WriterProcess&& other) noexcept;
  WriterProcess& operator=(WriterProcess&& other) noexcept;
  WriterProcess(const WriterProcess&) = delete;
  WriterProcess& operator=(const WriterProcess&) = delete;
  ~WriterProcess();

  // Whether the process has exited (true only when known).
  bool Gone() const;
  pid_t pid() const { return pid_; }

 private:
  WriterProcess(pid_t pid, int pidfd) : pid_(pid), pidfd_(pidfd) {}
  pid_t pid_ = 0;
  int pidfd_ = -1;
};

class WriterFences {
 public:
  WriterFences() = default;
  WriterFences(const WriterFences&) = delete;
  WriterFences& operator=(const WriterFences&) = delete;

  // Fences the ended lease `lease_token`, written by push `push_id` of `writer`;
  // `on_released` is handed back when it is released (the caller runs it).
  void Add(uint64_t lease_token, uint64_t push_id, WriterProcess writer, std::function<void()> on_released);
  // The writer of (lease_token, push_id) acknowledged that it writes no more: releases
  // its fence and returns its on_released. Nullopt when there was none (never fenced,
  // or released already).
  std::optional<std::function<void()>> Acknowledge(uint64_t lease_token, uint64_t push_id);
  // Releases every fence whose writer's process is gone; returns their on_released.
  std::vector<std::function<void()>> ReleaseGone();
  // Drops every fence without releasing it (the transport is shutting down: its leases'
  // blocks stay out of use).
  void Clear() { fences_.clear(); }
  int64_t size() const { return static_cast<int64_t>(fences_.size()); }

 private:
  struct Fence {
    uint64_t push_id = 0;
    WriterProcess writer;
    std::function<void()> on_released;
  };
  absl::flat_hash_map<uint64_t, Fence> fences_;  // by lease token
};

}  // namespace kvmesh::kv
