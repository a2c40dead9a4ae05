#include "backend/cpu/memory_bandwidth.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/huge_pages.h"

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

volatile uint64_t read_sink = 0;

// Bytes of each buffer: well past the last-level cache.
int64_t BufferBytes() { return std::max<int64_t>(int64_t{1} << 30, 2 * LastLevelCacheBytes()) / 64 * 64; }

// Median rate of `bytes_per_run / seconds` over timed runs of `run` (after a warm-up).
template <typename Run>
double MedianRate(double bytes_per_run, Run&& run) {
  constexpr int kRuns = 7;
  std::vector<double> rates;
  for (int i = 0; i <= kRuns; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 0) rates.push_back(bytes_per_run / seconds);  // run 0 is the warm-up
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

}  // namespace

double MeasureCopyBandwidthBytesPerSecond(int num_threads) {
  if (num_threads <= 0) num_threads = omp_get_num_procs();
  const int64_t bytes = BufferBytes();
  const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
  HugePageMemory src_memory = AllocateHugePageMemory(bytes), dst_memory = AllocateHugePageMemory(bytes);
  if (src_memory == nullptr || dst_memory == nullptr) return 0.0;
  float* src = reinterpret_cast<float*>(src_memory.get());
  float* dst = reinterpret_cast<float*>(dst_memory.get());
  // First touch by the same threads that copy (pages land where they are used).
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    src[i] = static_cast<float>(i & 1023);
    dst[i] = 0.0f;
  }
  return MedianRate(2.0 * static_cast<double>(bytes), [&] {
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
  });
}

double MeasureReadBandwidthBytesPerSecond(int num_threads) {
  if (num_threads <= 0) num_threads = omp_get_num_procs();
  const int64_t bytes = BufferBytes();
  const int64_t n = bytes / static_cast<int64_t>(sizeof(uint64_t));
  HugePageMemory memory = AllocateHugePageMemory(bytes);
  if (memory == nullptr) return 0.0;
  uint64_t* words = reinterpret_cast<uint64_t*>(memory.get());
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) words[i] = static_cast<uint64_t>(i);
  return MedianRate(static_cast<double>(bytes), [&] {
    uint64_t total = 0;
#pragma omp parallel for num_threads(num_threads) schedule(static) reduction(+ : total)
    for (int64_t i = 0; i < n; i += 8) {
      // Eight independent sums: loads, not an add chain, bound the loop.
      uint64_t s = 0;
      for (int j = 0; j < 8; ++j) s += words[i + j];
      total += s;
    }
    read_sink = total;  // used, so the reads are not optimised away
  });
}

}  // namespace kvmesh::backend
