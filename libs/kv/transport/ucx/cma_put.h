// Same-host puts by cross-memory attach (process_vm_writev: one kernel copy straight
// into the receiver's pool, nothing for the receiver to do), beside UCX. Why not UCX's
// own cma transport: Debian's UCX 1.13 uses it for rendezvous only; a ucp_put_nbx over
// shared memory reaches only memory UCX allocated itself (sysv/posix segments), and a
// put into a registered pool is emulated over active messages through the shm FIFO,
// which measured 2-9 GB/s with a tail of 15 ms here (RMA bandwidth lanes for
// UCP_FEATURE_RMA came in UCX 1.14, openucx/ucx#8537).
//
// A sender uses it only when the receiver's descriptor says it runs on this host in
// this PID namespace (same_host.h) and UCX_TLS allows cma; a kernel that refuses
// (ptrace policy, seccomp) fails that push, and the transport's later pushes go as
// rendezvous runs. The receiver cannot refuse such a write: writer_fence.h is how it
// keeps a late one out of reused blocks.
//
// Thread-safety: pure functions.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace kvmesh::kv {

// Writes [local, local + bytes) to `remote` in process `pid`. Unavailable when the
// process is gone (ESRCH); PermissionDenied when the kernel refuses cross-memory attach
// (EPERM, ENOSYS: fall back to another path); InvalidArgument when the remote range is
// not mapped there (EFAULT); Internal otherwise.
absl::Status CmaWrite(pid_t pid, const std::byte* local, size_t bytes, uint64_t remote);

}  // namespace kvmesh::kv
