// Shows ThreadSanitizer the order an OpenMP team's fork and join give its threads' memory.
// GCC's libgomp is not TSan-instrumented: it hands a region to its pooled threads and
// joins them through futexes and atomics TSan never sees, so every write a team thread
// makes looks unordered against the master's reads after the region (a false race).
// Without TSan every call is empty and compiles away.
#ifndef KVMESH_CORE_OMP_TEAM_SYNC_H_
#define KVMESH_CORE_OMP_TEAM_SYNC_H_

#if defined(__SANITIZE_THREAD__)
#define KVMESH_OMP_TEAM_SYNC_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVMESH_OMP_TEAM_SYNC_TSAN 1
#endif
#endif

#ifdef KVMESH_OMP_TEAM_SYNC_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace kvmesh::core {

// One per parallel region, on the master's stack:
//   OmpTeamSync sync;  sync.BeforeFork();
//   #pragma omp parallel { sync.AtThreadStart(); ...; sync.AtThreadEnd(); }
//   sync.AfterJoin();
// TSan keys its sync object by this object's address; its release joins clocks, so every
// thread's AtThreadEnd is ordered before the master's AfterJoin.
class OmpTeamSync {
 public:
  void BeforeFork() { Release(); }
  void AtThreadStart() { Acquire(); }
  void AtThreadEnd() { Release(); }
  void AfterJoin() { Acquire(); }

 private:
#ifdef KVMESH_OMP_TEAM_SYNC_TSAN
  void Release() { __tsan_release(this); }
  void Acquire() { __tsan_acquire(this); }
#else
  void Release() {}
  void Acquire() {}
#endif
};

}  // namespace kvmesh::core

#endif  // KVMESH_CORE_OMP_TEAM_SYNC_H_
