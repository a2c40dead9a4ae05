#include "cast/cast.h"

#include "cast/cast_kernel.cuh"

namespace kvmesh::kernels {
namespace {

template <bool kBf16>
cudaError_t Launch(const float* in, int64_t n, uint16_t* out, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  cast::CastKernel<kBf16><<<cast::CastGrid(n), cast::kThreads, 0, stream>>>(in, n, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchCastF32ToBf16(const float* in, int64_t n, uint16_t* out, cudaStream_t stream) {
  return Launch<true>(in, n, out, stream);
}

cudaError_t LaunchCastF32ToF16(const float* in, int64_t n, uint16_t* out, cudaStream_t stream) {
  return Launch<false>(in, n, out, stream);
}

}  // namespace kvmesh::kernels
