// The kernel table of one ISA build (compiled once per ISA, see vec.h).
#include "backend/cpu/kernels_isa.h"

namespace kvmesh::backend::cpu {

#if defined(KVMESH_CPU_AVX512)
const KernelTable& Avx512Kernels() {
#else
const KernelTable& Avx2Kernels() {
#endif
  namespace isa = KVMESH_CPU_ISA;
#if defined(KVMESH_CPU_AVX512)
  static constexpr const char* kIsaName = "avx512";
#else
  static constexpr const char* kIsaName = "avx2";
#endif
  static constexpr KernelTable kTable = {
      .isa = kIsaName,
      .amx_bf16 = false,
      .bf16_pairs_in_compute_mode = false,
      .linear = &isa::Linear,
      .linear_bf16 = &isa::LinearBf16,
      .embedding = &isa::Embedding,
      .rms_norm = &isa::RmsNorm,
      .rope = &isa::Rope,
      .silu_and_mul = &isa::SiluAndMul,
      .dense_attention = &isa::DenseAttention,
      .write_kv_cache = &isa::WriteKvCache,
      .paged_attention = &isa::PagedAttention,
  };
  return kTable;
}

}  // namespace kvmesh::backend::cpu
