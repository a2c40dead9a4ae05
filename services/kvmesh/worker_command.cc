// `kvmesh worker --role prefill|decode|both`: the worker of libs/worker (worker.h) with
// the flags of libs/cli/worker_flags.h, the same one kvmesh-prefill-worker and
// kvmesh-decode-worker run.
#include "cli/worker_flags.h"
#include "commands.h"

namespace kvmesh::cli {

int RunWorker(int argc, char** argv) { return RunWorkerCommand(argc, argv, {.program = "kvmesh worker"}); }

}  // namespace kvmesh::cli
