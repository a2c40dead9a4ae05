// ThreadSanitizer build only (KVMESH_SANITIZE=thread): makes the happens-before edges of
// absl::Mutex and absl::CondVar visible to TSan.
//
// Debian's libabsl_synchronization is not built with -fsanitize=thread, and gRPC locks
// through it too (GPR_ABSEIL_SYNC: grpc_core::Mutex and gpr_mu are absl::Mutex). TSan sees
// none of that locking, so without this file it reports every access guarded by an
// absl::Mutex (ours, or gRPC handing a call from one of its threads to another) as a race.
//
// How: every executable of the TSan build defines the library's exported entry points
// under their mangled names. The dynamic linker binds the executable's definition first,
// for our calls and for the calls from libgrpc / libgpr / libabsl itself (they go through
// the PLT, checked with objdump: Notification::Notify calls Mutex::Lock@plt). Each
// wrapper tells TSan what the call does (__tsan_acquire after taking the mutex,
// __tsan_release before letting it go, keyed by the mutex's address) and forwards to the
// library's definition, found with dlsym(RTLD_NEXT). Reader locks are modelled as the
// writer lock (acquire/release); that can hide a write made under a reader lock, which
// clang's -Wthread-safety build catches instead.
//
// Thread-safety: every wrapper is called concurrently; the resolved pointers are atomics.
// The names are those of absl 20220623 (inline namespace debian3), Debian 12's.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

// Same layout and calling convention as absl::Duration and absl::Time (16 trivially
// copyable bytes, passed in two integer registers); only forwarded, never read.
struct Duration {
  int64_t hi;
  uint32_t lo;
};
struct Time {
  Duration rep;
};

void* Resolve(const char* name) {
  void* fn = dlsym(RTLD_NEXT, name);
  if (fn == nullptr) {
    fprintf(stderr, "tsan_absl_sync: %s not found in libabsl_synchronization\n", name);
    abort();
  }
  return fn;
}

template <typename Fn>
Fn Real(std::atomic<void*>& slot, const char* name) {
  void* fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = Resolve(name);
    slot.store(fn, std::memory_order_release);
  }
  return reinterpret_cast<Fn>(fn);
}

// A Condition is evaluated inside the library with the mutex held (by the waiter, or by
// the thread letting the mutex go, which checks its waiters' conditions), where no
// wrapper runs: the predicate's reads would look unguarded. So the wrappers that take a
// Condition pass the library a Condition of their own, made with its exported
// Condition(bool (*)(void*), void*), that tells TSan the mutex is held around the
// original's evaluation. absl 20220623's Condition is 40 bytes; its first field is the
// evaluator, bool (*eval_)(const Condition*), null for "true" (Condition::Eval inlined).
struct HeldCondition {
  const void* original;
  void* mu;
  alignas(8) unsigned char wrapper[40];
};

bool EvalHeld(void* arg) {
  auto* held = static_cast<HeldCondition*>(arg);
  __tsan_acquire(held->mu);
  bool (*eval)(const void*);
  std::memcpy(&eval, held->original, sizeof(eval));
  const bool result = eval == nullptr || eval(held->original);
  __tsan_release(held->mu);
  return result;
}

const void* MakeHeld(HeldCondition* held, const void* cond, void* mu) {
  static std::atomic<void*> slot{nullptr};
  held->original = cond;
  held->mu = mu;
  Real<void (*)(void*, bool (*)(void*), void*)>(slot, "_ZN4absl7debian39ConditionC1EPFbPvES2_")(held->wrapper,
                                                                                                 &EvalHeld, held);
  return held->wrapper;
}

}  // namespace

// Each KVMESH_TSAN_WRAP defines one interposer: NAME (mangled), the return type, the
// parameter list after `self`, the argument names, and what TSan is told BEFORE and
// AFTER the real call (`self` is the Mutex, or the CondVar's Mutex* argument `mu`).
#define KVMESH_TSAN_WRAP(NAME, RET, PARAMS, ARGS, BEFORE, AFTER)          \
  extern "C" RET NAME(void* self PARAMS) {                                \
    static std::atomic<void*> slot{nullptr};                              \
    BEFORE;                                                               \
    RET result = Real<RET (*)(void* self PARAMS)>(slot, #NAME)(self ARGS); \
    AFTER;                                                                \
    return result;                                                        \
  }
#define KVMESH_TSAN_WRAP_VOID(NAME, PARAMS, ARGS, BEFORE, AFTER)            \
  extern "C" void NAME(void* self PARAMS) {                                 \
    static std::atomic<void*> slot{nullptr};                                \
    BEFORE;                                                                 \
    Real<void (*)(void* self PARAMS)>(slot, #NAME)(self ARGS);              \
    AFTER;                                                                  \
  }
#define KVMESH_COMMA ,
// BEFORE of the wrappers that take a Condition `cond`: the library gets `held_cond`.
#define KVMESH_HOLD \
  HeldCondition held; \
  const void* held_cond = MakeHeld(&held, cond, self)

// absl::Mutex: Lock, ReaderLock, Unlock, ReaderUnlock, TryLock, ReaderTryLock.
KVMESH_TSAN_WRAP_VOID(_ZN4absl7debian35Mutex4LockEv, , , (void)0, __tsan_acquire(self))
KVMESH_TSAN_WRAP_VOID(_ZN4absl7debian35Mutex10ReaderLockEv, , , (void)0, __tsan_acquire(self))
KVMESH_TSAN_WRAP_VOID(_ZN4absl7debian35Mutex6UnlockEv, , , __tsan_release(self), (void)0)
KVMESH_TSAN_WRAP_VOID(_ZN4absl7debian35Mutex12ReaderUnlockEv, , , __tsan_release(self), (void)0)
KVMESH_TSAN_WRAP(_ZN4absl7debian35Mutex7TryLockEv, bool, , , (void)0,
                 if (result) __tsan_acquire(self))
KVMESH_TSAN_WRAP(_ZN4absl7debian35Mutex13ReaderTryLockEv, bool, , , (void)0,
                 if (result) __tsan_acquire(self))

// absl::Mutex::LockWhen* and ReaderLockWhen*: return holding the mutex (the timed ones
// even on timeout).
KVMESH_TSAN_WRAP_VOID(_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE, KVMESH_COMMA const void* cond,
                      KVMESH_COMMA held_cond, KVMESH_HOLD, __tsan_acquire(self))
KVMESH_TSAN_WRAP_VOID(_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE,
                      KVMESH_COMMA const void* cond, KVMESH_COMMA held_cond, KVMESH_HOLD, __tsan_acquire(self))
KVMESH_TSAN_WRAP(_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE, bool,
                 KVMESH_COMMA const void* cond KVMESH_COMMA Duration d, KVMESH_COMMA held_cond KVMESH_COMMA d,
                 KVMESH_HOLD, __tsan_acquire(self))
KVMESH_TSAN_WRAP(_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE, bool,
                 KVMESH_COMMA const void* cond KVMESH_COMMA Time t, KVMESH_COMMA held_cond KVMESH_COMMA t,
                 KVMESH_HOLD, __tsan_acquire(self))
KVMESH_TSAN_WRAP(_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE, bool,
                 KVMESH_COMMA const void* cond KVMESH_COMMA Duration d, KVMESH_COMMA held_cond KVMESH_COMMA d,
                 KVMESH_HOLD, __tsan_acquire(self))
KVMESH_TSAN_WRAP(_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE, bool,
                 KVMESH_COMMA const void* cond KVMESH_COMMA Time t, KVMESH_COMMA held_cond KVMESH_COMMA t,
                 KVMESH_HOLD, __tsan_acquire(self))

// absl::Mutex::Await*: called holding the mutex; may let it go and take it back.
KVMESH_TSAN_WRAP_VOID(_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE, KVMESH_COMMA const void* cond,
                      KVMESH_COMMA held_cond, KVMESH_HOLD; __tsan_release(self), __tsan_acquire(self))
KVMESH_TSAN_WRAP(_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE, bool,
                 KVMESH_COMMA const void* cond KVMESH_COMMA Duration d, KVMESH_COMMA held_cond KVMESH_COMMA d,
                 KVMESH_HOLD; __tsan_release(self), __tsan_acquire(self))
KVMESH_TSAN_WRAP(_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE, bool,
                 KVMESH_COMMA const void* cond KVMESH_COMMA Time t, KVMESH_COMMA held_cond KVMESH_COMMA t,
                 KVMESH_HOLD; __tsan_release(self), __tsan_acquire(self))

// absl::CondVar::Wait*(Mutex* mu): lets `mu` go while waiting and takes it back.
KVMESH_TSAN_WRAP_VOID(_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE, KVMESH_COMMA void* mu,
                      KVMESH_COMMA mu, __tsan_release(mu), __tsan_acquire(mu))
KVMESH_TSAN_WRAP(_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE, bool,
                 KVMESH_COMMA void* mu KVMESH_COMMA Duration d, KVMESH_COMMA mu KVMESH_COMMA d,
                 __tsan_release(mu), __tsan_acquire(mu))
KVMESH_TSAN_WRAP(_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE, bool,
                 KVMESH_COMMA void* mu KVMESH_COMMA Time t, KVMESH_COMMA mu KVMESH_COMMA t,
                 __tsan_release(mu), __tsan_acquire(mu))
