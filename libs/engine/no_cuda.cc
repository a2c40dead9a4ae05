// CreateCudaModelRunner in a build without CUDA: a clear error, as
// backend/no_cuda_backend.cc gives for the backend.
#include "engine/cuda_model_runner.h"

namespace kvmesh::engine {

namespace {
constexpr char kNoCuda[] =
    "this kvmesh was built without CUDA (no nvcc at configure time); rebuild with -DKVMESH_CUDA=ON for --device cuda";
}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaModelRunner(LlamaModel& /*model*/,
                                                                   const CudaModelRunnerOptions& /*options*/,
                                                                   comm::Communicator* /*comm*/) {
  return absl::FailedPreconditionError(kNoCuda);
}

absl::StatusOr<int32_t> CudaKvPoolBlocks(const LlamaModel& /*model*/, const CudaModelRunnerOptions& /*options*/) {
  return absl::FailedPreconditionError(kNoCuda);
}

absl::StatusOr<CudaHostTierMemory> MakeCudaHostTierMemory(int /*device*/, bool /*managed*/) {
  return absl::FailedPreconditionError(
      "this kvmesh was built without CUDA (no nvcc at configure time): no pinned or managed host KV tier");
}

}  // namespace kvmesh::engine
