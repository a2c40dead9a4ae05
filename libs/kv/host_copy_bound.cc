#include "kv/host_copy_bound.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

namespace kvmesh::kv {
namespace {

// Whole blocks filling max(256 MiB, 2 x the last-level cache).
int64_t BoundBlocks(int64_t block_bytes) {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);  // 0 or -1 where unknown
  const int64_t target = std::max<int64_t>(int64_t{256} << 20, 2 * static_cast<int64_t>(std::max(0L, l3)));
  return std::max<int64_t>(1, target / std::max<int64_t>(1, block_bytes));
}

// One pass: `blocks` memcpys of `block_bytes`, in order, each of `threads` copying its
// contiguous share. Bytes per second.
double CopyPass(std::byte* dst, const std::byte* src, int64_t blocks, int64_t block_bytes, int32_t threads) {
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    for (int64_t b = blocks * t / n; b < blocks * (t + 1) / n; ++b) {
      std::memcpy(dst + b * block_bytes, src + b * block_bytes, static_cast<size_t>(block_bytes));
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(blocks * block_bytes) / seconds;
}

int32_t ClampThreads(int32_t num_threads, int64_t blocks) {
  return static_cast<int32_t>(std::clamp<int64_t>(num_threads, 1, blocks));
}

}  // namespace

HostCopyBound MeasureHostCopyBound(int64_t block_bytes, int32_t repeats, int32_t num_threads) {
  const int64_t blocks = BoundBlocks(block_bytes);
  const size_t bytes = static_cast<size_t>(blocks * block_bytes);
  auto src = std::make_unique_for_overwrite<std::byte[]>(bytes);
  auto dst = std::make_unique_for_overwrite<std::byte[]>(bytes);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 0, bytes);
  const int32_t threads = ClampThreads(num_threads, blocks);
  std::vector<double> rates;
  for (int32_t r = 0; r < std::max(1, repeats); ++r) {
    rates.push_back(CopyPass(dst.get(), src.get(), blocks, block_bytes, threads));
  }
  std::nth_element(rates.begin(), rates.begin() + static_cast<std::ptrdiff_t>(rates.size() / 2), rates.end());
  return {.bytes_per_second = rates[rates.size() / 2],
          .buffer_bytes = static_cast<int64_t>(bytes),
          .block_bytes = block_bytes,
          .num_threads = threads};
}

IdleHostCopyBound::IdleHostCopyBound(int64_t block_bytes)
    : block_bytes_(block_bytes),
      blocks_(BoundBlocks(block_bytes)),
      src_(std::make_unique_for_overwrite<std::byte[]>(static_cast<size_t>(blocks_ * block_bytes))),
      dst_(std::make_unique_for_overwrite<std::byte[]>(static_cast<size_t>(blocks_ * block_bytes))),
      written_(std::chrono::steady_clock::now()) {
  std::memset(dst_.get(), 0, static_cast<size_t>(blocks_ * block_bytes_));
}

HostCopyBound IdleHostCopyBound::Measure(int32_t num_threads) {
  // The source freshly written (a pool's blocks are touched every step); only the
  // destination has idled, as an evicted host slot has.
  std::memset(src_.get(), 1, static_cast<size_t>(blocks_ * block_bytes_));
  const int32_t threads = ClampThreads(num_threads, blocks_);
  idle_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - written_).count();
  const double rate = CopyPass(dst_.get(), src_.get(), blocks_, block_bytes_, threads);
  written_ = std::chrono::steady_clock::now();
  return {.bytes_per_second = rate,
          .buffer_bytes = blocks_ * block_bytes_,
          .block_bytes = block_bytes_,
          .num_threads = threads};
}

}  // namespace kvmesh::kv
