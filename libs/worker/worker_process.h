// RunWorkerProcess: a whole worker process of the disaggregated cluster (worker_process.cc
// has the flags). kvmesh-prefill-worker and kvmesh-decode-worker run it with their role
// fixed; `kvmesh worker --role prefill|decode|both` runs it from the kvmesh CLI.
//
// Thread-safety: call once, from main's thread, before any other thread starts.
#pragma once

#include <optional>

#include "kvmesh/v1/scheduler.pb.h"

namespace kvmesh::worker {

struct WorkerProcessOptions {
  const char* program = "kvmesh worker";  // in --help and error messages
  // A role binary's role; nullopt: --role decides.
  std::optional<v1::WorkerRole> role;
};

// Parses the flags in argv, serves until SIGTERM / SIGINT, drains and returns the exit
// status (0; 1 when it could not start).
int RunWorkerProcess(int argc, char** argv, const WorkerProcessOptions& options);

}  // namespace kvmesh::worker
