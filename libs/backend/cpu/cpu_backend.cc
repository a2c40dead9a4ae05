// Temporary stub while the AVX-512/AVX2 backend is written (issue #2).
#include "absl/status/status.h"
#include "backend/ops.h"

namespace kvmesh::backend {

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const CpuBackendOptions& options) {
  return absl::UnimplementedError("CreateCpuBackend: being written");
}

}  // namespace kvmesh::backend
