// `kvmesh worker --role prefill|decode|both`: the worker process of libs/worker
// (worker_process.h), the same one kvmesh-prefill-worker and kvmesh-decode-worker run.
#include "commands.h"
#include "worker/worker_process.h"

namespace kvmesh::cli {

int RunWorker(int argc, char** argv) { return worker::RunWorkerProcess(argc, argv, {.program = "kvmesh worker"}); }

}  // namespace kvmesh::cli
