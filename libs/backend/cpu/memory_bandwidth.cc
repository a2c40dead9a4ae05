#include "backend/cpu/memory_bandwidth.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace kvmesh::backend {
namespace {

int64_t LastLevelCacheBytes() {
  long llc = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
#ifdef _SC_LEVEL2_CACHE_SIZE
  if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return llc > 0 ? llc : 0;
}

}  // namespace

double MeasureCopyBandwidthBytesPerSecond(int num_threads) {
  if (num_threads <= 0) num_threads = omp_get_num_procs();
  const int64_t bytes = std::max<int64_t>(int64_t{1} << 30, 2 * LastLevelCacheBytes()) / 64 * 64;
  const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
  float* src = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(bytes)));
  float* dst = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(bytes)));
  if (src == nullptr || dst == nullptr) {
    std::free(src);
    std::free(dst);
    return 0.0;
  }
  // First touch by the same threads that copy (pages land where they are used).
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    src[i] = static_cast<float>(i & 1023);
    dst[i] = 0.0f;
  }
  constexpr int kRuns = 7;
  std::vector<double> rates;
  for (int run = 0; run <= kRuns; ++run) {
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(num_threads)
    {
      const int64_t nt = omp_get_num_threads();
      const int64_t tid = omp_get_thread_num();
      const int64_t begin = n * tid / nt / 16 * 16;
      const int64_t end = tid + 1 == nt ? n : n * (tid + 1) / nt / 16 * 16;
      // NOTE: memcpy, as STREAM's copy kernel compiles to: glibc picks its
      // fastest routine (non-temporal stores for sizes this large).
      std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin) * sizeof(float));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (run > 0) rates.push_back(2.0 * static_cast<double>(bytes) / seconds);  // run 0 is the warm-up
  }
  std::free(src);
  std::free(dst);
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace kvmesh::backend
