#include "kv/host_copy_bound.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

namespace kvmesh::kv {

HostCopyBound MeasureHostCopyBound(int64_t block_bytes, int32_t repeats, int32_t num_threads) {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);  // 0 or -1 where unknown
  const int64_t target = std::max<int64_t>(int64_t{256} << 20, 2 * static_cast<int64_t>(std::max(0L, l3)));
  const int64_t blocks = std::max<int64_t>(1, target / std::max<int64_t>(1, block_bytes));
  const size_t bytes = static_cast<size_t>(blocks * block_bytes);
  auto src = std::make_unique_for_overwrite<std::byte[]>(bytes);
  auto dst = std::make_unique_for_overwrite<std::byte[]>(bytes);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 0, bytes);
  const int32_t threads = static_cast<int32_t>(std::clamp<int64_t>(num_threads, 1, blocks));
  std::vector<double> rates;
  for (int32_t r = 0; r < std::max(1, repeats); ++r) {
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
      for (int64_t b = blocks * t / n; b < blocks * (t + 1) / n; ++b) {
        std::memcpy(dst.get() + b * block_bytes, src.get() + b * block_bytes, static_cast<size_t>(block_bytes));
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(static_cast<double>(bytes) / seconds);
  }
  std::nth_element(rates.begin(), rates.begin() + static_cast<std::ptrdiff_t>(rates.size() / 2), rates.end());
  return {.bytes_per_second = rates[rates.size() / 2],
          .buffer_bytes = static_cast<int64_t>(bytes),
          .block_bytes = block_bytes,
          .num_threads = threads};
}

}  // namespace kvmesh::kv
