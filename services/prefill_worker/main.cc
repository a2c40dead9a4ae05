// kvmesh-prefill-worker: a prefill worker of the disaggregated cluster as a binary of its
// own (one Deployment per role); `kvmesh worker --role prefill` runs the same worker.
// Its flags (libs/cli/worker_flags.h) become a worker::WorkerOptions, and a
// worker::Worker (libs/worker/worker.h) serves until SIGTERM, then drains.
#include "cli/worker_flags.h"

int main(int argc, char** argv) {
  return kvmesh::cli::RunWorkerCommand(argc, argv,
                                       {.program = "kvmesh-prefill-worker", .role = kvmesh::v1::WORKER_ROLE_PREFILL});
}
