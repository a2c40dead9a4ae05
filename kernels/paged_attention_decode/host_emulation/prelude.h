// Host emulation of the decode kernels (paged_attention_decode_kernel.cuh), for tests on
// machines without a GPU: kernels/host_emulation/prelude.h (threads, barriers, warp shuffles,
// `__shared__` arrays as function statics shared by the CTA's threads) is all they need.
// Everything else they call is host-callable already: cuda_fp8.h's
// __nv_cvt_fp8x2_to_halfraw2, cuda_fp16.h's __half22float2, make_float4, fmaf, exp2f.
//
// How a test uses it: this header is the translation unit's first include, then
// emulated_launch.h runs a launch. No folder shadows a kernel header: kernels/ on the
// include path is all the build adds.
#pragma once

#include "host_emulation/prelude.h"
