#include "rms_norm/rms_norm.h"

#include <cuda_bf16.h>

#include "rms_norm/rms_norm_kernel.cuh"

namespace kvmesh::kernels {
namespace {

template <typename W, bool kAddResidual>
cudaError_t Launch(float* residual, const float* x, const W* weight, float eps, int64_t num_tokens, int64_t hidden,
                   float* out, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  rms_norm::RmsNormKernel<W, kAddResidual>
      <<<rms_norm::RmsNormGrid(num_tokens), rms_norm::kThreads, 0, stream>>>(residual, x, weight, eps, hidden, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchRmsNormF32Bf16Weight(const float* x, const uint16_t* weight, float eps, int64_t num_tokens,
                                      int64_t hidden, float* out, cudaStream_t stream) {
  return Launch<__nv_bfloat16, false>(nullptr, x, reinterpret_cast<const __nv_bfloat16*>(weight), eps, num_tokens,
                                      hidden, out, stream);
}

cudaError_t LaunchRmsNormF32F32Weight(const float* x, const float* weight, float eps, int64_t num_tokens,
                                     int64_t hidden, float* out, cudaStream_t stream) {
  return Launch<float, false>(nullptr, x, weight, eps, num_tokens, hidden, out, stream);
}

cudaError_t LaunchAddRmsNormF32Bf16Weight(float* residual, const float* x, const uint16_t* weight, float eps,
                                         int64_t num_tokens, int64_t hidden, float* out, cudaStream_t stream) {
  return Launch<__nv_bfloat16, true>(residual, x, reinterpret_cast<const __nv_bfloat16*>(weight), eps, num_tokens,
                                     hidden, out, stream);
}

cudaError_t LaunchAddRmsNormF32F32Weight(float* residual, const float* x, const float* weight, float eps,
                                        int64_t num_tokens, int64_t hidden, float* out, cudaStream_t stream) {
  return Launch<float, true>(residual, x, weight, eps, num_tokens, hidden, out, stream);
}

}  // namespace kvmesh::kernels
