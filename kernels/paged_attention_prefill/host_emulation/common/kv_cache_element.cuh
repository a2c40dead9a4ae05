// Host emulation (see ../prelude.h): the real encodings header, whose device functions a host
// compiler does not see, plus a host DecodeKv for FP8 (core/dtype.h's exact e4m3 decode).
#pragma once

#include "../../../common/kv_cache_element.cuh"
#include "core/dtype.h"

namespace kvmesh::kernels {

inline float DecodeKv(uint8_t x, float scale) { return ::kvmesh::Fp8E4M3ToF32(x) * scale; }

}  // namespace kvmesh::kernels
