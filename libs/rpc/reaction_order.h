// ReactionOrder: shows ThreadSanitizer the order gRPC gives one reactor's reactions.
//
// A read reactor's next OnReadDone runs only after the StartRead that asked for it, and
// OnDone after the last reaction; but the hand-over happens inside Debian's
// uninstrumented libgrpc (its transport's combiner queues through plain atomics), on
// whichever poller thread completes the operation. So TSan sees two successive reactions
// of one stream on two threads as unordered and reports the reactor's own state, which
// no two threads ever touch at once. Release() right before starting the next operation
// and Acquire() first thing in the reaction it completes draw that edge for TSan; both
// compile to nothing in other builds.
//
// Thread-safety: as the reactor contract it describes (one reaction at a time).
#pragma once

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace kvmesh::rpc {

class ReactionOrder {
 public:
  void Release() {
#if defined(__SANITIZE_THREAD__)
    __tsan_release(this);
#endif
  }
  void Acquire() {
#if defined(__SANITIZE_THREAD__)
    __tsan_acquire(this);
#endif
  }
};

}  // namespace kvmesh::rpc
