// Host emulation of the decode kernels (paged_attention_decode_kernel.cuh), for tests on
// machines without a GPU: the prefill emulation's prelude (threads, barriers, warp shuffles;
// kernels/paged_attention_prefill/host_emulation/prelude.h) plus the little the decode
// kernels use beyond it. Everything else they call is host-callable already: cuda_fp8.h's
// __nv_cvt_fp8x2_to_halfraw2, cuda_fp16.h's __half22float2, make_float4, fmaf, exp2f.
//
// How a test uses it: this header is the translation unit's first include, then
// emulated_launch.h runs a launch. No folder shadows a kernel header: kernels/ on the
// include path is all the build adds.
#pragma once

// Before the prefill prelude empties __device__: parsed as the real headers, their include
// guards then keep kv_vector.cuh's own includes of them from being parsed again.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "paged_attention_prefill/host_emulation/prelude.h"

#include <bit>
#include <cstdint>

// The decode kernels declare their shared arrays inside the function (the prefill kernel's
// is one `extern` array): as function statics, the CTA's threads share them. NOTE: they are
// not poisoned before each CTA as the prefill emulation's are (GCC 12 ignores a section
// attribute on a function template's statics, so there is no range to fill): each CTA starts
// with the previous CTA's leftovers, as a GPU's shared memory often does. A read of an element
// the CTA has not written yet shows only where those leftovers differ from the right value.
#undef __shared__
#define __shared__ static

inline float __uint_as_float(uint32_t bits) { return std::bit_cast<float>(bits); }
