// CreateCudaBackend in a build without CUDA (nvcc was not found when CMake configured
// it): a clear error instead of a missing symbol, so `--device cuda` says why.
#include "backend/ops.h"

namespace kvmesh::backend {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int /*device*/) {
  return absl::FailedPreconditionError(
      "this kvmesh was built without CUDA (no nvcc at configure time); rebuild with -DKVMESH_CUDA=ON for --device cuda");
}

}  // namespace kvmesh::backend
