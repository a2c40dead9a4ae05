// Reading and writing one element of a paged KV pool (libs/kv/kv_layout.h) on the device,
// for every pool element type: f32, bf16 (bits as core/dtype.h's F32ToBf16) and FP8 e4m3
// with a per-KV-head scale (stored = value / scale, saturated to +-448; read = stored *
// scale). Shared by the kernels that write the pool (reshape_and_cache) and the ones that
// read it (paged attention decode and prefill), so all agree on the encoding.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>
#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#endif

namespace kvmesh::kernels {

// The pool's element type, as the launchers take it (kernels/ includes no engine header).
enum class KvCacheDType : int32_t { kF32 = 0, kBf16 = 1, kFp8E4M3 = 2 };

// Storage type of each KvCacheDType.
template <KvCacheDType kDType> struct KvStorageType;
template <> struct KvStorageType<KvCacheDType::kF32> { using type = float; };
template <> struct KvStorageType<KvCacheDType::kBf16> { using type = uint16_t; };
template <> struct KvStorageType<KvCacheDType::kFp8E4M3> { using type = uint8_t; };

// The device functions below are for nvcc and for the host emulation of the kernels
// (kernels/host_emulation/prelude.h defines KVMESH_HOST_EMULATION); launcher headers include
// this file for KvCacheDType, and other host code (the CUDA backend) compiles it without them.
#if defined(__CUDACC__) || defined(KVMESH_HOST_EMULATION)

// bf16 bits -> f32: exact.
__device__ __forceinline__ float Bf16BitsToFloat(uint16_t bits) { return __uint_as_float(uint32_t{bits} << 16); }

// f32 -> bf16 bits, round to nearest even, NaN kept quiet with its sign: bit for bit
// core/dtype.h's F32ToBf16.
__device__ __forceinline__ uint16_t FloatToBf16Bits(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// f32 -> e4m3 bits, round to nearest even, saturating to +-448 (NaN stays NaN): the
// conversion cuda_fp8.h does in hardware on sm_89+ and emulates on sm_80.
__device__ __forceinline__ uint8_t FloatToFp8E4M3Bits(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
// e4m3 bits -> f32: exact.
__device__ __forceinline__ float Fp8E4M3BitsToFloat(uint8_t bits) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(bits), __NV_E4M3);
  return __half2float(__half(h));
}

// Encodes `x` for the pool; `scale` is the KV head's FP8 scale (ignored otherwise).
__device__ __forceinline__ float EncodeKv(float x, float /*scale*/, float*) { return x; }
__device__ __forceinline__ uint16_t EncodeKv(float x, float /*scale*/, uint16_t*) { return FloatToBf16Bits(x); }
__device__ __forceinline__ uint8_t EncodeKv(float x, float scale, uint8_t*) { return FloatToFp8E4M3Bits(x / scale); }

// Decodes one stored element to f32.
__device__ __forceinline__ float DecodeKv(float x, float /*scale*/) { return x; }
__device__ __forceinline__ float DecodeKv(uint16_t x, float /*scale*/) { return Bf16BitsToFloat(x); }
__device__ __forceinline__ float DecodeKv(uint8_t x, float scale) { return Fp8E4M3BitsToFloat(x) * scale; }

#endif  // __CUDACC__ || KVMESH_HOST_EMULATION

}  // namespace kvmesh::kernels
