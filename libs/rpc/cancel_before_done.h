// Makes explicit, with one atomic, the order gRPC promises between a server reactor's
// OnCancel and OnDone. gRPC runs the two on threads it picks and orders them inside
// libgrpc++'s core (ServerCallbackCall::ScheduleOnDone hands OnDone to another thread),
// which ThreadSanitizer cannot see in Debian's uninstrumented build; a reactor whose
// OnDone frees what OnCancel touched then looked like a use racing a free (TSan, CI:
// PrefillReactor's job freed in OnDone after its OnCancel answered the call). The release
// at the end of OnCancel and the acquire at the start of OnDone are that promise, stated
// where TSan sees it; they cost one uncontended atomic per call.
#ifndef KVMESH_RPC_CANCEL_BEFORE_DONE_H_
#define KVMESH_RPC_CANCEL_BEFORE_DONE_H_

#include <atomic>

namespace kvmesh::rpc {

// Thread-safe. Usage: last in OnCancel, CancelReturned(); first in OnDone, DoneStarts().
class CancelBeforeDone {
 public:
  void CancelReturned() { cancel_returned_.store(true, std::memory_order_release); }
  void DoneStarts() { static_cast<void>(cancel_returned_.load(std::memory_order_acquire)); }

 private:
  std::atomic<bool> cancel_returned_{false};
};

}  // namespace kvmesh::rpc

#endif  // KVMESH_RPC_CANCEL_BEFORE_DONE_H_
