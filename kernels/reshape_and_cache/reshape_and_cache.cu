#include "reshape_and_cache/reshape_and_cache.h"

#include "reshape_and_cache/reshape_and_cache_kernel.cuh"

namespace kvmesh::kernels {
namespace {

template <typename T>
cudaError_t Launch(const float* k, const float* v, const int64_t* slots, int64_t num_tokens, const KvCacheShape& shape,
                   const float* k_scale, const float* v_scale, T* kv_cache, cudaStream_t stream) {
  if (shape.num_kv_heads <= 0 || shape.head_dim <= 0 || shape.block_size_tokens <= 0 || num_tokens < 0 ||
      num_tokens > 0x7fffffff || shape.num_kv_heads > 0x7fffffff / shape.head_dim) {
    return cudaErrorInvalidValue;
  }
  if (num_tokens == 0) return cudaSuccess;
  reshape_and_cache::ReshapeAndCacheKernel<T>
      <<<reshape_and_cache::ReshapeAndCacheGrid(num_tokens), reshape_and_cache::kThreads, 0, stream>>>(
          k, v, slots, shape, k_scale, v_scale, kv_cache);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchReshapeAndCacheF32(const float* k, const float* v, const int64_t* slots, int64_t num_tokens,
                                     const KvCacheShape& shape, float* kv_cache, cudaStream_t stream) {
  return Launch(k, v, slots, num_tokens, shape, nullptr, nullptr, kv_cache, stream);
}

cudaError_t LaunchReshapeAndCacheBf16(const float* k, const float* v, const int64_t* slots, int64_t num_tokens,
                                      const KvCacheShape& shape, uint16_t* kv_cache, cudaStream_t stream) {
  return Launch(k, v, slots, num_tokens, shape, nullptr, nullptr, kv_cache, stream);
}

cudaError_t LaunchReshapeAndCacheFp8(const float* k, const float* v, const int64_t* slots, int64_t num_tokens,
                                     const KvCacheShape& shape, const float* k_scale, const float* v_scale,
                                     uint8_t* kv_cache, cudaStream_t stream) {
  if (k_scale == nullptr || v_scale == nullptr) return cudaErrorInvalidValue;
  return Launch(k, v, slots, num_tokens, shape, k_scale, v_scale, kv_cache, stream);
}

}  // namespace kvmesh::kernels
