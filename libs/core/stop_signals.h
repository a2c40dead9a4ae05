// The shutdown signals of every long-running kvmesh process (serve, worker, router,
// kv-store): SIGINT and SIGTERM, blocked in every thread and taken by one sigwait.
//
// Thread-safety: BlockStopSignals first thing in main, before any thread starts (threads
// inherit the mask); WaitForStopSignal from the thread that will shut down.
#pragma once

namespace kvmesh {

// Blocks SIGINT and SIGTERM in the calling thread; threads started afterwards
// inherit the mask, so WaitForStopSignal() on this thread receives them.
void BlockStopSignals();
// Waits for SIGINT or SIGTERM (after BlockStopSignals) and returns its number.
int WaitForStopSignal();

}  // namespace kvmesh
