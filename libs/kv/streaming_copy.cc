#include "kv/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

namespace kvmesh::kv {

void StreamingCopy(std::byte* dst, const std::byte* src, size_t bytes, const std::byte* prefetch_next) {
#if defined(__x86_64__)
  const bool aligned = (reinterpret_cast<uintptr_t>(dst) % 16 == 0) && (reinterpret_cast<uintptr_t>(src) % 16 == 0);
  if (!aligned || bytes % 64 != 0) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto* d = reinterpret_cast<__m128i*>(dst);
  const auto* s = reinterpret_cast<const __m128i*>(src);
  const char* next = reinterpret_cast<const char*>(prefetch_next);
  for (size_t i = 0; i < bytes / 16; i += 4) {
    // NOTE: the whole next source, one line per line copied, into L2 (T1): a scattered
    // source of a few KiB is over before the hardware prefetcher has locked on, and
    // requests into L1 (T0) would hold the few L1 miss buffers the loads need.
    if (next != nullptr) _mm_prefetch(next + i * 16, _MM_HINT_T1);
    const __m128i a = _mm_load_si128(s + i);
    const __m128i b = _mm_load_si128(s + i + 1);
    const __m128i c = _mm_load_si128(s + i + 2);
    const __m128i e = _mm_load_si128(s + i + 3);
    _mm_stream_si128(d + i, a);
    _mm_stream_si128(d + i + 1, b);
    _mm_stream_si128(d + i + 2, c);
    _mm_stream_si128(d + i + 3, e);
  }
#else
  (void)prefetch_next;
  std::memcpy(dst, src, bytes);
#endif
}

void StreamingCopyFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace kvmesh::kv
