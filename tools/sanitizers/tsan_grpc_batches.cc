// ThreadSanitizer build only (KVMESH_SANITIZE=thread): makes visible to TSan how gRPC
// hands one call's batch of operations from the thread that starts it to the thread
// that completes it.
//
// gRPC C++ fills an op set (the message to send, the buffer to receive into, the
// reactor's tag) on the caller's thread and hands it to core with
// grpc_call_start_batch; a poller thread completes it: the op set's FinalizeResult
// (inlined from grpcpp/impl/call_op_set.h into our binaries) finishes each op, drops
// the call reference FillOps took (grpc_call_unref) and runs the reaction (OnReadDone,
// OnWriteDone, a unary callback), which may start the next batch. Core passes the batch
// along through its own atomics and combiner queues, which Debian's uninstrumented
// libgrpc does not show TSan, so successive reactions of one call on two pollers looked
// unordered: their accesses to the reactor's own state, and to the op set's fields
// (CallOpSendMessage::SendMessagePtr storing its serializer), were reported as races.
//
// How: as tools/sanitizers/tsan_absl_sync.cc does for absl::Mutex, every executable of
// the TSan build defines the two exported C entry points; libgrpc++ calls them through
// its PLT (CoreCodegen::grpc_call_start_batch / grpc_call_unref jump to
// grpc_call_start_batch@plt / grpc_call_unref@plt, checked with objdump), so the
// executable's definitions are bound first. grpc_call_start_batch releases on the call
// before starting the batch; grpc_call_unref acquires on the call before dropping the
// reference. Keyed by the call, so every batch started on a call orders before every
// later completion on it: that is more order than core promises between two batches of
// one call in flight together (a stream's read and write), so a race between a stream's
// read and write reactions could hide; races with every other thread still show.
// The receive op's deserialization (CallOpRecvMessage::FinishOp) runs before the unref,
// so it stays suppressed in tools/tsan.supp.
//
// Thread-safety: called concurrently; the resolved pointers are atomics.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>

// Opaque here: only forwarded (grpc/grpc.h is not included, so that the targets that do
// not link gRPC need none of its headers). grpc_call_error is an int-sized enum.
struct grpc_call;
struct grpc_op;

namespace {

template <typename Fn>
Fn Real(std::atomic<void*>& slot, const char* name) {
  void* fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = dlsym(RTLD_NEXT, name);
    if (fn == nullptr) {
      std::fprintf(stderr, "tsan_grpc_batches: %s not found in libgrpc\n", name);
      std::abort();
    }
    slot.store(fn, std::memory_order_release);
  }
  return reinterpret_cast<Fn>(fn);
}

}  // namespace

extern "C" int grpc_call_start_batch(grpc_call* call, const grpc_op* ops, size_t nops, void* tag, void* reserved) {
  static std::atomic<void*> slot{nullptr};
  __tsan_release(call);
  return Real<int (*)(grpc_call*, const grpc_op*, size_t, void*, void*)>(slot, "grpc_call_start_batch")(
      call, ops, nops, tag, reserved);
}

extern "C" void grpc_call_unref(grpc_call* call) {
  static std::atomic<void*> slot{nullptr};
  __tsan_acquire(call);
  Real<void (*)(grpc_call*)>(slot, "grpc_call_unref")(call);
}
