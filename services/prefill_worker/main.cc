// kvmesh-prefill-worker: a prefill worker of the disaggregated cluster as a binary of its
// own (one Deployment per role); `kvmesh worker --role prefill` runs the same process.
#include "worker/worker_process.h"

int main(int argc, char** argv) {
  return kvmesh::worker::RunWorkerProcess(
      argc, argv, {.program = "kvmesh-prefill-worker", .role = kvmesh::v1::WORKER_ROLE_PREFILL});
}
