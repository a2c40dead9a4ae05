// What the AVX-512 Linear kernels that hold a 32-column panel's row as two 16-lane
// halves (the AMX C tiles, the VDPBF16PS accumulators) share: the row's store with its
// bias, and the split of the panels over threads. Include only from sources compiled
// with AVX-512 (amx_linear_kernel.cc, bf16_dot_linear_kernel.cc).
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <cstdint>

#include "backend/cpu/kernels.h"

namespace kvmesh::backend::cpu {

// One call's weights (kBF16Amx panels: K padded to kp, whole 32-k blocks) and output.
struct PanelCall {
  int64_t kb;  // kp / 32
  int64_t m;
  int64_t n;
  const char* panels;
  int64_t panel_bytes;  // kp * 64
  const float* bias;    // padded to whole panels, or nullptr
  float* out;           // [m, n]
};
inline PanelCall PanelCallOf(const PackedPanels& w, int64_t m, float* out) {
  const int64_t kp = (w.k + kAmxK - 1) / kAmxK * kAmxK;
  return {.kb = kp / kAmxK,
          .m = m,
          .n = w.n,
          .panels = static_cast<const char*>(w.data),
          .panel_bytes = kp * kPanelCols * 2,
          .bias = w.bias,
          .out = out};
}

// out_row[col0 .. col0 + 31] = (v0, v1) + bias (padded to whole panels; nullptr: none),
// clipped at column n.
inline __attribute__((always_inline)) void StorePanelRow(float* out_row, __m512 v0, __m512 v1, const float* bias,
                                                         int64_t col0, int64_t n) {
  const int64_t cols = n - col0 < kPanelCols ? n - col0 : kPanelCols;
  const __mmask16 mask0 = cols >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << cols) - 1u);
  const __mmask16 mask1 = cols >= 32   ? __mmask16{0xffff}
                          : cols <= 16 ? __mmask16{0}
                                       : static_cast<__mmask16>((1u << (cols - 16)) - 1u);
  if (bias != nullptr) {
    v0 = _mm512_add_ps(v0, _mm512_loadu_ps(bias + col0));
    v1 = _mm512_add_ps(v1, _mm512_loadu_ps(bias + col0 + 16));
  }
  _mm512_mask_storeu_ps(out_row + col0, mask0, v0);
  if (mask1 != 0) _mm512_mask_storeu_ps(out_row + col0 + 16, mask1, v1);
}

// range(p_begin, p_end) on contiguous ranges of `panels`, one per thread: threads never
// share an output element, so no barrier. One thread below 2^16 multiply-adds (`work`),
// where waking the team costs more than the product.
template <typename Range>
void ForEachPanelRange(int64_t panels, int64_t work, int num_threads, Range range) {
  const int threads = work < (1 << 16) ? 1 : static_cast<int>(panels < num_threads ? panels : num_threads);
  if (threads <= 1) {
    range(int64_t{0}, panels);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t nt = omp_get_num_threads();
    const int64_t tid = omp_get_thread_num();
    range(panels * tid / nt, panels * (tid + 1) / nt);
  }
}

}  // namespace kvmesh::backend::cpu
